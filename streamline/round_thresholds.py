"""Integer thresholds for MultiThresholds on integer inputs, as FINN's Thresholding layers store them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from finnlite.core.datatypes import BaseDataType, is_integer_type
from finnlite.core.graphutil import add_constant
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.lower_common import is_op, union_datatype
from streamline.real_thresholds import ThresholdPrecisionError, get_real_thresholds

if TYPE_CHECKING:
    from finnlite.core.model import Model


def integer_thresholds(node: ir.Node, t: np.ndarray, dt: BaseDataType) -> np.ndarray:
    """The integer thresholds equivalent to ``t`` for inputs of datatype ``dt``, clipped to
    ``[dt.min(), dt.max() + 1]``: from the node's exact real thresholds when it carries them (ceiling, or floor + 1
    where strict), else ``⌈t⌉``. :class:`~streamline.real_thresholds.ThresholdPrecisionError` if one of them is an
    integer float32 cannot hold (never rounded)."""
    lo, hi = float(dt.min()), float(dt.max())
    rt = get_real_thresholds(node)
    if rt is not None and rt.shape[1] == t.shape[1] and (rt.shape[0] == t.shape[0] or 1 in (rt.shape[0], t.shape[0])):
        exact = rt.integer_thresholds(lo, hi).astype(np.float64)
        rows = max(exact.shape[0], t.shape[0])
        return np.broadcast_to(exact, (rows, exact.shape[1])).copy()
    out = np.clip(np.ceil(t.astype(np.float64)), lo, hi + 1)
    if not np.array_equal(out.astype(np.float32).astype(np.float64), out):
        raise ThresholdPrecisionError("an integer threshold is not a float32 number")
    return out


@dataclass(frozen=True, slots=True, eq=False)
class RoundedThresholds:
    """A MultiThreshold (``node``) on an integer input, its integer ``thresholds`` and their datatype ``dt``."""

    node: ir.Node
    thresholds: np.ndarray
    dt: Any


@register_pass(group="lower")
class RoundAndClipThresholds(Rule):
    """MultiThreshold(x, T) with x of an integer datatype  →  MultiThreshold(x, clip(⌈T⌉, min, max + 1)).

    Pattern: a MultiThreshold with constant thresholds whose input carries an integer ``finn_datatype`` (INTn, UINTn,
    BIPOLAR, BINARY, ...). Algebra: for an integer ``x``, ``x ≥ t ⇔ x ≥ ⌈t⌉``; a threshold below the datatype's
    minimum is passed by every input, as is the minimum itself, and one above the maximum by none, as is
    ``max + 1`` — so clipping to ``[min, max + 1]`` keeps every count (clipping to ``max``, as older FINN versions
    do, would count ``x = max`` for a threshold above it). Sorted rows stay sorted. With exact real thresholds on the
    node (:mod:`streamline.real_thresholds`) the integers come from them (``⌈R⌉``, or ``⌊R⌋ + 1`` where strict),
    which is what the original graph means in real arithmetic; where one of those integers is not a float32 number
    (an accumulator range beyond 2^24), the rule declines rather than round it. The threshold tensor is annotated
    with the narrowest datatype holding the input's range and the thresholds — one bit wider than the input only
    when ``max + 1`` occurs — rather than the input's datatype, which cannot express ``max + 1``; a shared threshold
    initializer is copied, not changed in place."""

    op_types = ("MultiThreshold",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_op(node, "MultiThreshold", custom=True):
            return None
        t = const_array(node.inputs[1])
        if t is None or t.ndim != 2:
            return self.miss(node, "the thresholds are not a constant 2-D tensor")
        dt = model.get_tensor_datatype(node.inputs[0].name)
        if not is_integer_type(dt):
            return None
        try:
            new_t = integer_thresholds(node, t, dt)
        except ThresholdPrecisionError as exc:
            return self.miss(node, f"its thresholds stay float32 numbers: {exc}")
        tdt = union_datatype(dt, float(new_t.min(initial=dt.min())), float(new_t.max(initial=dt.max())))
        if new_t.shape == t.shape and np.array_equal(new_t, t):
            model.set_tensor_datatype(node.inputs[1].name, tdt)  # annotation only: not a rewrite
            return None
        return RoundedThresholds(node, new_t.astype(np.float32), tdt)

    def rewrite(self, model: "Model", match: RoundedThresholds) -> None:
        node, new_t, tdt = match.node, match.thresholds, match.dt
        t_val = add_constant(model, new_t, f"{node.name or 'MultiThreshold'}_thresholds", tdt)
        old = node.inputs[1]
        node.replace_input_with(1, t_val)
        model.drop_if_unused(old)
