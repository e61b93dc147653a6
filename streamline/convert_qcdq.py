"""QCDQ / QDQ import: ``QuantizeLinear → [Clip] → DequantizeLinear`` chains become qonnx Quant nodes (qonnx's
``QCDQToQuant``), so that models quantized with standard ONNX ops (Brevitas' ``export_onnx_qcdq``, qonnx's
``QuantToQCDQ``, onnxruntime's ``quantize_static`` in QDQ format, PyTorch exporters) run the same pipeline.

Semantics (ONNX, with ``v = fl32(x / s)``; onnxruntime divides, it does not multiply by ``1/s``)::

    q = clip(round_half_even(v) + z, Qmin, Qmax)  [→ Clip(q, c_lo, c_hi)]      y = fl32(float(q − z) · s)

so ``y = s · clip(round_half_even(v), lo, hi)`` with ``lo = max(Qmin, c_lo) − z`` and ``hi = min(Qmax, c_hi) − z``
(``Qmin``/``Qmax`` the range of the integer type: int8, uint8, int4, uint4, int16, ...). A Quant rounds *after*
adding its zero-point (``round(v + z)``), which differs from ONNX at ties whenever z is odd, so no zero-point is
carried over; the integer range ``[lo, hi]`` decides the form instead:

* ``[lo, hi]`` is a standard range (``INTb``, narrow ``INTb``, ``UINTb``, narrow ``UINTb``): one
  ``Quant(x, s, 0, b, signed, narrow)`` — bit-exact in float32 (the Quant computes ``round(fl32(x/s))`` and
  ``fl32(q·s)`` as onnxruntime does). This covers symmetric quantizers, uint8 with z = 0 or 128, int8 with
  z = −128 (a ReLU output), and every Clip to a standard narrower range (int8 clipped to [−127, 127] is narrow,
  to [−8, 7] is INT4, uint8 to [0, 15] is UINT4).
* otherwise (an asymmetric quantizer, e.g. onnxruntime's default int8 activations with z = 13, or a Clip to
  bounds such as [−3, 5]) with a per-tensor scale: ``Clip(x, a, b) → Quant(·, s, 0, B, signed, 0)`` with the
  least standard range ``B`` holding ``[lo, hi]`` and float32 bounds ``a``, ``b`` at which the quantizer gives
  ``lo`` and ``hi``. Exact because the quantizer is monotone: clipping its input to points of its bottom and top
  levels clips its output to ``[lo, hi]``. The convert stage absorbs the Clip into the thresholds (the
  unreachable levels are dropped), so the MultiThreshold still has ``hi − lo`` thresholds.
* otherwise (a per-axis scale or zero-points whose ranges cannot be cut by one scalar Clip): an :class:`OpError`
  naming the DequantizeLinear and the range.

Constant chains (``DequantizeLinear`` of an integer initializer, or ``QuantizeLinear`` of a float weight) are
computed here as onnxruntime would, and become ``Quant(W, s, 0, b, signed, narrow)`` of that float weight (the
type of ``[lo, hi]``, widened to a standard one), which the convert stage folds into an integer weight (or, for a
bias, into its exact value ``(q − z)·s``) — only where the Quant reproduces ``W`` bit for bit: an int32 bias whose
integers stay below 2^24 does; otherwise (larger integers) the chain becomes the float constant ``W`` itself.

A QuantizeLinear and DequantizeLinear with different scales or zero-points (a requantization), block
quantization, float8 types and non-constant parameters are errors naming the node. A DequantizeLinear of a
non-constant integer tensor that no QuantizeLinear produces (an integer graph input) is left alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.quant import max_int, min_int, quant
from custom_ops.registry import QONNX_DOMAIN, is_standard_domain
from finnlite.core.datatypes import smallest_int_type
from finnlite.core.errors import OpError
from finnlite.core.graphutil import add_constant, clip_bounds, ensure_custom_domain, name_or_op, take_over
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.convert_common import drop_unused
from finnlite.core.policies import equality

if TYPE_CHECKING:
    from finnlite.core.model import Model

__all__ = ["QCDQToQuant", "standard_range", "integer_range_of"]

#: the largest integer range for which a Quant's float32 arithmetic is exact (float32 has a 24-bit significand)
_MAX_EXACT_BITS = 24


def integer_range_of(dtype: ir.DataType | None) -> tuple[int, int] | None:
    """(Qmin, Qmax) of an ONNX integer element type (INT8, UINT4, INT32, ...); None for anything else."""
    if dtype is None:
        return None
    m = re.fullmatch(r"(U?)INT(\d+)", dtype.name)
    if m is None:
        return None
    bits, signed = int(m.group(2)), not m.group(1)
    return min_int(signed, False, bits), max_int(signed, False, bits)


def standard_range(lo: int, hi: int) -> tuple[int, bool, bool] | None:
    """The Quant parameters (bit width, signed, narrow) whose integer range is exactly ``[lo, hi]``, or None.
    Standard ranges: ``[−2^(b−1), 2^(b−1) − 1]``, narrow ``[−2^(b−1) + 1, 2^(b−1) − 1]`` (b ≥ 2), ``[0, 2^b − 1]``
    and narrow ``[0, 2^b − 2]`` (b ≥ 2). (One signed bit is bipolar, {−1, +1}, not a range.)"""
    if lo == 0:
        for narrow in (False, True):
            bits = (hi + 1 + int(narrow)).bit_length() - 1
            if bits >= 1 + int(narrow) and max_int(False, narrow, bits) == hi:
                return bits, False, narrow
        return None
    if lo < 0:
        bits = (hi + 1).bit_length()
        for narrow in (False, True):
            if bits >= 2 and min_int(True, narrow, bits) == lo and max_int(True, narrow, bits) == hi:
                return bits, True, narrow
    return None


def _superset_range(lo: int, hi: int) -> tuple[int, bool, bool]:
    """The least standard (bit width, signed, not narrow) range holding ``[lo, hi]``."""
    dt = smallest_int_type(lo, hi)
    return dt.bitwidth(), dt.signed(), False


@dataclass
class _QParams:
    """The scale, zero-point and integer type of a QuantizeLinear/DequantizeLinear node."""

    scale: np.ndarray      # float32, 0-d or 1-d
    zero: np.ndarray       # int64, same shape as scale (broadcast)
    axis: int | None       # None: per tensor
    qmin: int
    qmax: int

    def same_as(self, other: "_QParams") -> bool:
        return (self.axis == other.axis and self.qmin == other.qmin and self.qmax == other.qmax
                and np.array_equal(self.scale, other.scale) and np.array_equal(self.zero, other.zero))


def _qparams(node: ir.Node, int_dtype: ir.DataType | None) -> _QParams:
    """The parameters of a QuantizeLinear/DequantizeLinear node; :class:`OpError` naming it where they are not
    constant, not float32, or use block quantization or a non-integer type."""
    label = name_or_op(node)
    if node.attributes.get("block_size") is not None and node.attributes["block_size"].value:
        raise OpError(f"{node.op_type}: block quantization (block_size) is not supported", node=label)
    scale_v = node.inputs[1] if len(node.inputs) > 1 else None
    scale = const_array(scale_v)
    if scale is None:
        raise OpError(f"{node.op_type}: the scale is not a constant", node=label,
                      tensor=scale_v.name if scale_v is not None else None)
    if scale.dtype != np.float32:
        raise OpError(f"{node.op_type}: the scale is {scale.dtype}, only float32 is supported", node=label)
    if not np.all(np.isfinite(scale)) or not np.all(scale > 0):
        raise OpError(f"{node.op_type}: the scale must be finite and > 0", node=label)
    zero_v = node.inputs[2] if len(node.inputs) > 2 else None
    zero = const_array(zero_v)
    if zero_v is not None and zero is None:
        raise OpError(f"{node.op_type}: the zero-point is not a constant", node=label, tensor=zero_v.name)
    if int_dtype is None and zero_v is not None:
        int_dtype = zero_v.dtype
    if int_dtype is None and "output_dtype" in node.attributes:
        int_dtype = ir.DataType(node.attributes["output_dtype"].value)
    if int_dtype is None:
        int_dtype = ir.DataType.UINT8  # ONNX's default when there is no zero-point
    bounds = integer_range_of(int_dtype)
    if bounds is None:
        raise OpError(f"{node.op_type}: the quantized type {int_dtype.name} is not an integer type (float8 and "
                      "other types are not supported)", node=label)
    zero = np.zeros((), np.int64) if zero is None else np.asarray(zero).astype(np.int64)
    if scale.ndim > 1 or zero.ndim > 1:
        raise OpError(f"{node.op_type}: scale and zero-point must be scalars or 1-D", node=label)
    per_axis = scale.size > 1 or zero.size > 1
    axis = int(node.attributes["axis"].value) if "axis" in node.attributes else 1
    scale, zero = np.broadcast_arrays(scale, zero)
    if not per_axis:
        scale, zero = scale.reshape(()), zero.reshape(())
    return _QParams(np.array(scale, np.float32), np.array(zero, np.int64), axis if per_axis else None, *bounds)


@dataclass
class _Chain:
    """A matched ``[QuantizeLinear] → [Clip] → DequantizeLinear`` chain."""

    dq: ir.Node
    source: ir.Value        # the float input of the QuantizeLinear, or the integer constant the DQ reads
    quantize: bool          # True: ``source`` is quantized by a QuantizeLinear first
    params: _QParams
    lo: np.ndarray          # int64 per channel (0-d per tensor): the least value of q − z
    hi: np.ndarray
    constant: np.ndarray | None  # the source's value if it is a constant


def _clip_bounds(node: ir.Node) -> tuple[int | None, int | None]:
    bounds = clip_bounds(node)
    if bounds is None:
        raise OpError("Clip between QuantizeLinear and DequantizeLinear: the bounds must be scalar constants",
                      node=name_or_op(node))
    return tuple(None if b is None else int(b) for b in bounds)  # type: ignore[return-value]


def _read_chain(node: ir.Node) -> _Chain | None:
    label = name_or_op(node)
    v = node.inputs[0]
    clip: ir.Node | None = None
    p = v.producer()
    if p is not None and p.op_type == "Clip" and is_standard_domain(p.domain):
        clip, v = p, p.inputs[0]
        p = v.producer()
    q = p if p is not None and p.op_type == "QuantizeLinear" and is_standard_domain(p.domain) else None
    int_value = node.inputs[0] if clip is None else clip.inputs[0]
    params = _qparams(node, int_value.dtype)
    if q is not None:
        qp = _qparams(q, int_value.dtype)
        if not qp.same_as(params):
            raise OpError(f"QuantizeLinear '{name_or_op(q)}' and this DequantizeLinear use different scales, "
                          "zero-points or types (a requantization), which no Quant expresses", node=label)
        source = q.inputs[0]
        if source.dtype is not None and source.dtype != ir.DataType.FLOAT:
            raise OpError(f"QuantizeLinear '{name_or_op(q)}': input type {source.dtype.name}, only float32 is "
                          "supported", node=label)
    else:
        source = v
    constant = const_array(source)
    if q is None and constant is None:
        return None  # a DequantizeLinear of an integer tensor computed at run time: an ordinary float op
    lo, hi = params.qmin, params.qmax
    if clip is not None:
        c_lo, c_hi = _clip_bounds(clip)
        lo = lo if c_lo is None else max(lo, c_lo)
        hi = hi if c_hi is None else min(hi, c_hi)
        if lo > hi:
            raise OpError(f"the Clip '{name_or_op(clip)}' leaves an empty integer range", node=label)
    return _Chain(node, source, q is not None, params, lo - params.zero, hi - params.zero, constant)


def _shaped(arr: np.ndarray, axis: int | None, rank: int) -> np.ndarray:
    """A per-axis parameter reshaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    if axis is None or arr.ndim == 0:
        return arr
    return arr.reshape([arr.size] + [1] * (rank - 1 - axis))


def _level(x: np.float32, s: np.float32) -> int:
    return int(np.round(np.float32(x) / s))


def _plateau_point(level: int, s: np.float32) -> np.float32 | None:
    """A float32 ``a`` with ``round_half_even(fl32(a / s)) == level`` (near ``level·s``), or None."""
    a = np.float32(np.float32(level) * s)
    for direction in (np.float32(np.inf), np.float32(-np.inf)):
        b = a
        for _ in range(64):
            if _level(b, s) == level:
                return b
            b = np.nextafter(b, direction)
    return None


@equality
@register_pass(group="tidy")
class QCDQToQuant(Rule):
    """QuantizeLinear(x, s, z) → [Clip] → DequantizeLinear(·, s, z)  ⇒  [Clip(x, a, b) →] Quant(x, s, 0, b, ±, n).

    The Clip in front (float32 bounds) only where the integer range is not a standard one, with the least standard
    range B holding it as the Quant's; constant chains become the Quant of the float weight onnxruntime computes
    (or that float constant, where a Quant would not reproduce it).

    Algebra (module docstring): ``DQ(Clip(Q(x))) = s·clip(round_half_even(fl32(x/s)), lo, hi)`` with
    ``[lo, hi] = [max(Qmin, c_lo) − z, min(Qmax, c_hi) − z]``; a Quant with zero-point 0 and that integer range
    computes the same float32 values. Conditions: constant float32 scales > 0 and integer zero-points equal in the
    QuantizeLinear and the DequantizeLinear; an integer type; integer scalar Clip bounds. Bit-exact."""

    op_types = ("DequantizeLinear",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_standard_domain(node.domain) or not node.inputs or node.inputs[0] is None:
            return None
        return _read_chain(node)

    def rewrite(self, model: "Model", chain: _Chain) -> None:
        if chain.constant is not None:
            new = self._constant(model, chain)
        else:
            new = self._activation(model, chain)
        dq = chain.dq
        old_inputs = list(dq.inputs)
        take_over(model, dq.outputs[0], new)
        model.remove_node(dq)
        drop_unused(model, old_inputs)

    # -- activations ---------------------------------------------------------------------------------------
    def _activation(self, model: "Model", c: _Chain) -> ir.Value:
        p, label = c.params, name_or_op(c.dq)
        rank = len(c.source.shape) if c.source.shape is not None else None
        if p.axis is not None and rank is None:
            raise OpError("per-axis DequantizeLinear of a tensor of unknown rank", node=label, tensor=c.source.name)
        los, his = np.unique(c.lo), np.unique(c.hi)
        if los.size != 1 or his.size != 1:
            raise OpError(f"per-axis zero-points give different integer ranges per channel (q − z from "
                          f"{c.lo.min()}..{c.hi.min()} to {c.lo.max()}..{c.hi.max()}): no Quant has a range per "
                          "channel", node=label)
        lo, hi = int(los[0]), int(his[0])
        axis = None if p.axis is None else p.axis % rank
        scale = _shaped(p.scale, axis, rank or 0)
        x = c.source
        std = standard_range(lo, hi)
        if std is None:
            if p.scale.ndim != 0:
                raise OpError(f"the integer range [{lo}, {hi}] (type range {p.qmin}..{p.qmax}, zero-point "
                              f"{int(p.zero.reshape(-1)[0])}, after any Clip) is not a Quant's (bitwidth, signed, "
                              "narrow) range, and with a per-axis scale it cannot be cut by one Clip", node=label)
            x = self._clip(model, c, x, lo, hi, np.float32(p.scale))
            std = _superset_range(lo, hi)
        return self._quant(model, c.dq, x, scale, std)

    def _clip(self, model: "Model", c: _Chain, x: ir.Value, lo: int, hi: int, s: np.float32) -> ir.Value:
        a, b = _plateau_point(lo, s), _plateau_point(hi, s)
        if a is None or b is None:
            raise OpError(f"no float32 input reaches the integer range [{lo}, {hi}] at scale {float(s)!r}",
                          node=name_or_op(c.dq))
        base = name_or_op(c.dq)
        out = model.make_value_like(x, prefix=f"{base}_clip")
        clip = ir.Node("", "Clip", [x, add_constant(model, np.array(a, np.float32), f"{base}_clip_lo", None),
                                    add_constant(model, np.array(b, np.float32), f"{base}_clip_hi", None)],
                       outputs=[out], name=f"{base}_Clip")
        model.graph.insert_before(c.dq, clip)
        return out

    def _quant(self, model: "Model", dq: ir.Node, x: ir.Value, scale: np.ndarray,
               std: tuple[int, bool, bool]) -> ir.Value:
        bits, signed, narrow = std
        ensure_custom_domain(model)
        base = name_or_op(dq)
        inputs = [x, add_constant(model, np.asarray(scale, np.float32), f"{base}_scale", None),
                  add_constant(model, np.zeros((), np.float32), f"{base}_zeropt", None),
                  add_constant(model, np.array(bits, np.float32), f"{base}_bitwidth", None)]
        out = model.make_value_like(dq.outputs[0], prefix=f"{base}_quant")
        out.dtype = ir.DataType.FLOAT
        node = ir.Node(QONNX_DOMAIN, "Quant", inputs, outputs=[out], name=f"{base}_Quant",
                       attributes=[ir.AttrInt64("signed", int(signed)), ir.AttrInt64("narrow", int(narrow)),
                                   ir.AttrString("rounding_mode", "ROUND")])
        model.graph.insert_before(dq, node)
        return out

    # -- constants -----------------------------------------------------------------------------------------
    def _constant(self, model: "Model", c: _Chain) -> ir.Value:
        p = c.params
        arr = np.asarray(c.constant)
        rank = arr.ndim
        axis = None if p.axis is None else p.axis % max(rank, 1)
        scale, zero = _shaped(p.scale, axis, rank), _shaped(p.zero, axis, rank)
        if c.quantize:
            v = np.round(arr.astype(np.float32) / scale).astype(np.int64) + zero
            q = np.clip(v, p.qmin, p.qmax)
        else:
            q = arr.astype(np.int64)
        r = np.clip(q - zero, _shaped(c.lo, axis, rank), _shaped(c.hi, axis, rank))
        weight = (r.astype(np.float32) * scale).astype(np.float32)
        lo, hi = int(c.lo.min()), int(c.hi.max())
        std = standard_range(lo, hi) or _superset_range(lo, hi)
        base = name_or_op(c.dq)
        w = add_constant(model, weight, f"{base}_weight", None)
        if np.abs(r).max(initial=0) >= 2**_MAX_EXACT_BITS or not _reproduces(weight, scale, std):
            self.miss(c.dq, f"the {std[0]}-bit constant is kept as its float32 value (a Quant would not reproduce "
                            "it exactly)")
            return w
        return self._quant(model, c.dq, w, scale, std)


def _reproduces(weight: np.ndarray, scale: np.ndarray, std: tuple[int, bool, bool]) -> bool:
    bits, signed, narrow = std
    again = quant(weight, scale, np.float32(0), bits, signed, narrow)
    return bool(np.all((again == weight) | (again.view(np.int32) == weight.view(np.int32))))
