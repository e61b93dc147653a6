"""Constants of elementwise Mul/Add nodes, kept exactly, and their broadcasting along a channel axis.

Streamlining folds scales into each other (weight scale × BatchNorm factor × activation scale) and finally into
thresholds. A float32 initializer holds each product rounded; the exact value (a rational: every float is dyadic,
and BatchNorm's factor is taken from its float64 evaluation) travels with the node in its ``metadata_props`` under
``finnlite.exact`` so that thresholds are computed from the exact value, not from a rounded one. The float32
initializer stays what the graph computes when executed.

Helpers here find a node's constant operand, read it exactly, and reduce it to a per-channel vector.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import onnx_ir as ir

from finnlite.core.graphutil import sole_producer
from finnlite.core.shapes import const_array
from streamline.real_thresholds import fractions_of

EXACT_KEY = "finnlite.exact"
#: the key, in a node's in-memory ``meta`` store (never saved), of ``(text, array)``: the array behind the node's
#: exact-value text, so that reading it again costs no parsing while the text is the same object
_PARSED = "finnlite.exact"


def const_operand(node: ir.Node) -> tuple[int, np.ndarray] | None:
    """``(index, value)`` of the single constant input of a two-input elementwise node, or None."""
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    c0, c1 = const_array(node.inputs[0]), const_array(node.inputs[1])
    if (c0 is None) == (c1 is None):
        return None
    return (1, c1) if c1 is not None else (0, c0)  # type: ignore[return-value]



@dataclass(frozen=True, slots=True, eq=False)
class LinearInput:
    """A Mul or Add (``node``) with a constant operand (input ``const_index``, read as ``value``): the elementwise op
    a reorder rule moves (:func:`linear_input` finds one whose output feeds only the node that reads it)."""

    node: ir.Node
    const_index: int
    value: np.ndarray

    @property
    def data(self) -> ir.Value:
        """The computed operand (the one that is not the constant)."""
        return self.node.inputs[1 - self.const_index]

    def exact(self) -> np.ndarray:
        """The constant, exactly (:func:`exact_value`)."""
        return exact_value(self.node, self.value)


def linear_input(node: ir.Node, index: int, ops: tuple[str, ...]) -> LinearInput | None:
    """The :class:`LinearInput` producing input ``index`` of ``node`` if it is a Mul/Add in ``ops`` with a constant
    operand, feeding only ``node``."""
    lin = sole_producer(node, index, ops)
    c = const_operand(lin) if lin is not None else None
    return None if c is None else LinearInput(lin, c[0], c[1])

def exact_value(node: ir.Node, value: np.ndarray) -> np.ndarray:
    """The exact constant of ``node`` as an object array of Fractions (its metadata if present, else ``value``)."""
    text = node.metadata_props.get(EXACT_KEY)
    if not text:
        return fractions_of(value)
    hit = node.meta.get(_PARSED)
    if hit is None or hit[0] is not text:
        hit = (text, _parse_exact(text))
        node.meta[_PARSED] = hit
    return hit[1].copy()


def _parse_exact(text: str) -> np.ndarray:
    data = json.loads(text)
    arr = np.empty(len(data["values"]), dtype=object)
    for i, (n, d) in enumerate(data["values"]):
        arr[i] = Fraction(n, d)
    return arr.reshape(tuple(data["shape"]))


def set_exact(node: ir.Node, exact: np.ndarray | None) -> None:
    """Record the exact constant of ``node`` (None removes it): Fractions, or float64 values that are exact.
    Stored only when it differs from float32."""
    node.meta.pop(_PARSED, None)
    if exact is None:
        node.metadata_props.pop(EXACT_KEY, None)
        return
    shape = np.shape(exact)
    parsed = None
    if np.asarray(exact).dtype.kind == "f":  # float values: exact as they are, compared with float32 at once
        values = np.asarray(exact, dtype=np.float64)
        if not np.isfinite(values).all():
            raise ValueError("an exact constant must be finite")
        held = (values.astype(np.float32).astype(np.float64) == values).all()
        ratios = [] if held else [v.as_integer_ratio() for v in values.ravel().tolist()]
    else:
        flat = [v if isinstance(v, Fraction) else Fraction(v) for v in np.asarray(exact, dtype=object).ravel()]
        ratios = [v.as_integer_ratio() for v in flat]
        rounded = np.array([n / d for n, d in ratios]).astype(np.float32).astype(np.float64).tolist()
        held = all(f.as_integer_ratio() == r for f, r in zip(rounded, ratios))
        parsed = np.array(flat, dtype=object).reshape(shape)
    if held:
        node.metadata_props.pop(EXACT_KEY, None)
        return
    node.metadata_props[EXACT_KEY] = json.dumps({"shape": list(shape), "values": ratios})
    if parsed is not None:
        node.meta[_PARSED] = (node.metadata_props[EXACT_KEY], parsed)


def to_float32(exact: np.ndarray) -> np.ndarray:
    """The float32 array nearest to an object array of Fractions (or to float64 values)."""
    if np.asarray(exact).dtype.kind == "f":
        return np.asarray(exact, dtype=np.float64).astype(np.float32)
    values = [_float(v) for v in np.asarray(exact, dtype=object).ravel()]
    return np.asarray(values, dtype=np.float64).astype(np.float32).reshape(np.shape(exact))


def _float(v: Any) -> float:
    """``float(v)``, for a Fraction by one correctly rounded integer division (without numbers.Rational's)."""
    if isinstance(v, Fraction):
        n, d = v.as_integer_ratio()
        return n / d
    return float(v)


def channel_vector(value: np.ndarray, rank: int, axis: int) -> np.ndarray | None:
    """``value`` as a 1-D per-channel vector (length 1 for a scalar) if it broadcasts against a tensor of ``rank``
    and varies only along ``axis``; None otherwise."""
    arr = np.asarray(value, dtype=object) if np.asarray(value).dtype == object else np.asarray(value)
    if arr.ndim > rank:
        return None
    shape = (1,) * (rank - arr.ndim) + tuple(arr.shape)
    arr = arr.reshape(shape)
    for i, d in enumerate(shape):
        if d != 1 and i != (axis % rank):
            return None
    return arr.reshape(-1)


def shaped_for_axis(vec: np.ndarray, rank: int, axis: int) -> np.ndarray:
    """A per-channel vector reshaped to broadcast along ``axis`` of a tensor of ``rank`` (scalars stay scalars)."""
    vec = np.asarray(vec)
    if vec.size == 1:
        return vec.reshape(())
    shape = [1] * rank
    shape[axis % rank] = vec.size
    return vec.reshape(shape)


def new_const_node(model: Any, op: str, x: ir.Value, exact: np.ndarray, rank: int, axis: int, like: ir.Value,
                   name: str) -> ir.Node:
    """A new ``op`` (Mul or Add) node computing ``x op c`` with ``c`` the float32 rounding of the exact per-channel
    vector ``exact`` (Fractions or float64 values, shaped for ``axis``), its exact value recorded; its output is
    like ``like``."""
    shaped = shaped_for_axis(exact, rank, axis)
    c = model.add_initializer(to_float32(shaped), prefix=f"{name}_c")
    node = ir.Node("", op, [x, c], outputs=[model.make_value_like(like, name)], name=name)
    set_exact(node, shaped)
    return node
