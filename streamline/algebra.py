"""Ops by their algebra: what the rules need to know about an op, declared once per op (DESIGN.md).

Rules about scales, biases and layouts do not need an op's name, only what it *is*:

* **data movement** — every output element is one element of the data inputs, or a constant fill: Transpose,
  Reshape, Flatten, Squeeze, Unsqueeze, Identity, DepthToSpace, SpaceToDepth, nearest-neighbour Resize, Slice,
  Split, Concat, Gather with constant indices, Pad, Tile, Expand. The declaration (:data:`MOVEMENT`) says which
  inputs carry data and which holds the fill; the *element map* itself is the op's own, found by running the node
  on index tensors (:func:`custom_ops.movement.element_map`). So a constant ``c`` multiplied or added in front of
  the op is, after it, the op applied to ``c`` (:meth:`ElementMap.gather`), and a new layout op needs one line
  here, not new rules.
* **linear** and **selection** — each output element combines (sums, averages) or selects (the maximum of) input
  elements along some axes: Conv, ConvTranspose, MatMul, AveragePool, GlobalAveragePool, ReduceSum/Mean (linear),
  MaxPool, GlobalMaxPool, ReduceMax/Min (selection). The declaration (:func:`mixing`) names the *mixed* axes — those
  whose elements meet in one output element — and, for convolutions, the channel groups: a constant factor that
  does not vary along the mixed axes (and is equal within each channel group) comes out of the op unchanged, mapped
  to the output's channels (:func:`through_mixing`). That is the op's channel map.
* **elementwise monotone** — ``f`` increasing, applied to each element: Relu, Sigmoid, Tanh, Clip, LeakyRelu,
  HardSigmoid, ... (:data:`MONOTONE`): absorbed into thresholds (:mod:`streamline.absorb_monotone`), and, as every
  elementwise op, it commutes with data movement wherever ``f(fill) = fill``.

The rules that read this table are in :mod:`streamline.move`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.movement import ElementMap, element_map
from finnlite.core.graphutil import is_standard_domain, rank_of, zero_padded
from finnlite.core.shapes import const_array, const_shape

if TYPE_CHECKING:
    from finnlite.core.model import Model


@dataclass(frozen=True)
class Movement:
    """A data-movement op: ``data`` are the inputs that carry data (None: every input), ``fill`` the input holding
    the value of fill positions (Pad's constant)."""

    data: tuple[int, ...] | None = (0,)
    fill: int | None = None


#: the data-movement ops (module docstring); Resize only in mode "nearest", Gather only with constant indices
MOVEMENT: dict[str, Movement] = {
    "Transpose": Movement(), "Reshape": Movement(), "Flatten": Movement(), "Squeeze": Movement(),
    "Unsqueeze": Movement(), "Identity": Movement(), "DepthToSpace": Movement(), "SpaceToDepth": Movement(),
    "Resize": Movement(), "Upsample": Movement(), "Slice": Movement(), "Split": Movement(), "Concat": Movement(None),
    "Gather": Movement(), "Pad": Movement(fill=2), "Tile": Movement(), "Expand": Movement(),
}

#: elementwise increasing functions (strictly or not); the rules that absorb them are in streamline.absorb_monotone
MONOTONE = frozenset({"Relu", "Sigmoid", "Tanh", "Clip", "LeakyRelu", "PRelu", "HardSigmoid", "HardSwish",
                      "Softplus", "Softsign", "Elu", "Selu", "Erf", "Floor", "Ceil", "Round"})


def movement(node: ir.Node) -> Movement | None:
    """The declaration of ``node`` if it moves data (module docstring), else None."""
    if not is_standard_domain(node.domain):
        return None
    decl = MOVEMENT.get(node.op_type)
    if decl is None:
        return None
    if node.op_type in ("Resize", "Upsample"):
        mode = node.attributes.get("mode")
        if (mode.value if mode is not None else "nearest") != "nearest":
            return None
    return decl


def data_inputs(node: ir.Node, decl: Movement) -> list[int]:
    """The indices of ``node``'s data inputs."""
    if decl.data is None:
        return [i for i, v in enumerate(node.inputs) if v is not None]
    return [i for i in decl.data if i < len(node.inputs) and node.inputs[i] is not None]


def static_shape(v: ir.Value | None) -> list[int] | None:
    """The shape of ``v`` if every dimension is a known integer."""
    if v is None or v.shape is None or not all(isinstance(d, int) for d in v.shape):
        return None
    return [int(d) for d in v.shape]


def element_map_of(model: "Model", node: ir.Node) -> ElementMap | None:
    """The element map of data-movement ``node`` for its static shapes and constant parameters, or None."""
    decl = movement(node)
    if decl is None:
        return None
    data = data_inputs(node, decl)
    shapes: list[list[int] | None] = []
    consts: list[np.ndarray | None] = []
    for i, v in enumerate(node.inputs):
        shapes.append(static_shape(v) if i in data else None)
        consts.append(None if i in data or v is None else const_array(v))
    if any(shapes[i] is None for i in data):
        return None
    proto = ir.serde.serialize_node(node)
    return element_map(proto, data, shapes, consts, model.opset_version("") or 13,
                       decl.fill if decl.fill is not None and decl.fill < len(node.inputs) else None)


# -- constants as the smallest broadcastable arrays -----------------------------------------------------------------
def varying_axes(values: np.ndarray) -> list[int]:
    """The axes of size > 1 of a compressed constant (those it varies along)."""
    return [a for a, d in enumerate(np.shape(values)) if d > 1]


def compress(values: np.ndarray, care: np.ndarray | None = None) -> np.ndarray | None:
    """The smallest array that broadcasts to ``values``' shape and equals ``values`` wherever ``care`` is True
    (everywhere by default): each axis along which the cared-for values do not vary becomes of size 1. None if the
    positions that are not cared for cannot be filled consistently."""
    values = np.asarray(values, dtype=object)
    care = np.ones(values.shape, dtype=bool) if care is None else np.asarray(care, dtype=bool)
    full_values, full_care = values, care
    for axis in range(values.ndim):
        if values.shape[axis] == 1:
            continue
        first = np.expand_dims(np.argmax(care, axis=axis), axis)
        ref = np.take_along_axis(values, first, axis=axis)
        same = np.asarray(values == ref, dtype=bool) | ~care
        if same.all():
            values = ref
            care = np.expand_dims(care.any(axis=axis), axis)
    expanded = np.broadcast_to(values, full_values.shape)
    if not bool(np.all(np.asarray(expanded == full_values, dtype=bool) | ~full_care)):
        return None
    return values


# -- linear and selection ops: the axes they mix ---------------------------------------------------------------------
@dataclass(frozen=True)
class Mixing:
    """How a linear or selection op combines its input ``x`` (rank ``rank``): ``mixed`` are the axes of ``x`` whose
    elements meet in one output element; ``groups = (g, cin, cout)`` for a convolution (channel axis 1: output channel
    ``o`` reads the input channels of group ``o // (cout/g)``); ``dropped`` the mixed axes absent from the output
    (a reduction without keepdims); ``selection`` for a maximum or minimum (order matters: a negative factor turns
    one into the other); ``gain``: what a constant ``b`` added to every input element becomes in the output (an
    average or a maximum keeps it, a sum of ``n`` elements multiplies it by ``n``; None: it does not pass, the output
    is a weighted sum or counts padding); ``word`` names the mixed axes in misses."""

    rank: int
    mixed: frozenset[int]
    groups: tuple[int, int, int] | None = None
    dropped: tuple[int, ...] = ()
    selection: bool = False
    gain: int | None = None
    word: str = "spatial"


def _int_list(node: ir.Node, name: str, default: list[int]) -> list[int]:
    a = node.attributes.get(name)
    return [int(v) for v in a.value] if a is not None else default


def _reduce_axes(node: ir.Node, rank: int) -> list[int] | None:
    if "axes" in node.attributes:
        axes = _int_list(node, "axes", [])
    elif len(node.inputs) > 1 and node.inputs[1] is not None:
        arr = const_array(node.inputs[1])
        if arr is None:
            return None
        axes = [int(a) for a in np.asarray(arr).ravel()]
    else:
        noop = node.attributes.get("noop_with_empty_axes")
        if noop is not None and int(noop.value):
            return None
        axes = list(range(rank))
    return sorted(a % rank for a in axes)


def mixing(node: ir.Node) -> Mixing | None:
    """The :class:`Mixing` of a linear or selection op (module docstring), None for other ops or unknown shapes."""
    if not is_standard_domain(node.domain):
        return None
    op = node.op_type
    rank = rank_of(node.inputs[0], constants=False) if node.inputs else None
    if rank is None:
        return None
    spatial = frozenset(range(2, rank))
    if op in ("Conv", "ConvTranspose"):
        w = node.inputs[1].shape if len(node.inputs) > 1 and node.inputs[1] is not None else None
        x = node.inputs[0].shape
        if w is None or x is None or not isinstance(x[1], int) or not all(isinstance(d, int) for d in w):
            return None
        g = int(node.attributes["group"].value) if "group" in node.attributes else 1
        cout = int(w[0]) if op == "Conv" else int(w[1]) * g
        return Mixing(rank, spatial, groups=(g, int(x[1]), cout))
    if op == "MatMul":
        if len(node.inputs) < 2 or const_shape(node.inputs[1]) is None or rank < 1:
            return None  # (the shape only: a depthwise layer's weight is not made dense)
        return Mixing(rank, frozenset({rank - 1}), word="feature")
    if op == "MaxPool" or op == "GlobalMaxPool":
        return Mixing(rank, spatial, selection=True, gain=1)
    if op == "AveragePool":
        counts_pads = bool(int(node.attributes["count_include_pad"].value)) if (
            "count_include_pad" in node.attributes) else False
        return Mixing(rank, spatial, gain=None if counts_pads and zero_padded(node) else 1)
    if op == "GlobalAveragePool":
        return Mixing(rank, spatial, gain=1)
    if op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"):
        axes = _reduce_axes(node, rank)
        if axes is None:
            return None
        keep = node.attributes.get("keepdims")
        dropped = () if keep is None or int(keep.value) else tuple(axes)
        shape = node.inputs[0].shape
        gain: int | None = 1
        if op == "ReduceSum":
            sizes = [shape[a] for a in axes] if shape is not None else [None]
            gain = int(np.prod(sizes)) if all(isinstance(d, int) for d in sizes) else None
        return Mixing(rank, frozenset(axes), dropped=dropped, selection=op in ("ReduceMax", "ReduceMin"),
                      gain=gain, word="reduced")
    return None


def through_mixing(mix: Mixing, value: np.ndarray) -> np.ndarray | str:
    """The constant factor after the op for a factor ``value`` in front of it (``op(value·x) = result·op(x)``), as a
    compressed array broadcasting against the output; or why it does not pass (a reason for a miss)."""
    arr = np.asarray(value, dtype=object)
    if arr.ndim > mix.rank:
        return "the constant has a higher rank than the tensor"
    arr = arr.reshape((1,) * (mix.rank - arr.ndim) + arr.shape)
    for axis in sorted(mix.mixed):
        if arr.shape[axis] > 1:
            first = np.take(arr, [0], axis=axis)
            if not bool(np.all(np.asarray(arr == first, dtype=bool))):
                return f"varies along a {mix.word} axis"
            arr = first
    if mix.groups is not None and arr.shape[1] > 1:
        g, cin, cout = mix.groups
        if arr.shape[1] != cin:
            return "the constant does not match the channels"
        blocks = arr.reshape(arr.shape[:1] + (g, cin // g) + arr.shape[2:])
        first = blocks[:, :, :1]
        if not bool(np.all(np.asarray(blocks == first, dtype=bool))):
            return "varies within a channel group" if g > 1 else "varies along the channels a convolution sums"
        per_group = first.reshape(arr.shape[:1] + (g,) + arr.shape[2:])
        arr = np.repeat(per_group, cout // g, axis=1)
    if mix.dropped:
        arr = arr.reshape(tuple(d for a, d in enumerate(arr.shape) if a not in mix.dropped))
    out = compress(arr)
    assert out is not None  # every position is cared for
    return out
