"""Trunc → QuantAvgPool2d (after average pooling) or MultiThreshold; never left silently wrong.

Brevitas' ``TruncAvgPool2d`` exports ``AveragePool → Trunc`` (older exports ``AveragePool → Mul(k²) → Trunc``): the
average of a scaled integer tensor ``s_in·q`` is turned back into the window sum ``S = Σq`` by the Trunc's first
rounding and then shifted right. qonnx's ``QuantAvgPool2d`` computes exactly ``floor(S / 2^shift)`` on the integers,
so the pattern becomes ``QuantAvgPool2d(q) → Mul(output scale)``. Any other Trunc of version 2 (which clips to its
output range) is a non-decreasing step function of its float32 input and becomes a MultiThreshold exactly as an
activation Quant does; a version-1 Trunc outside the pattern has unbounded levels and is reported.

Which Trunc version a node is follows qonnx: the model's opset import of the node's domain (see
:mod:`custom_ops.trunc`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.quant import max_int, min_int
from custom_ops.quantavgpool2d import avgpool_shift
from custom_ops.registry import QONNX_DOMAIN, is_standard_domain, make_op
from custom_ops.trunc import trunc_v2
from finnlite.core.datatypes import BaseDataType, DataType, is_integer_type, smallest_int_type
from finnlite.core.errors import FinnliteError
from finnlite.core.graphutil import add_constant, annotate, ensure_custom_domain, rank_of, take_over
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.convert_acts import StepQuantizer, emit_multithreshold, solve_thresholds
from streamline.convert_common import (DEFAULT_MAX_THRESHOLD_BITS, FLOAT32, BitLimit, Unsupported, channels_of,
                                       check_threshold_count, const_input, drop_unused,
                                       is_custom, positive_scale, scalar_int)
from finnlite.core.policies import equality

if TYPE_CHECKING:
    from finnlite.core.model import Model

log = logging.getLogger(__name__)

#: bound on the float32 error of AveragePool and the Trunc's division, relative to the largest window sum, per
#: element of the window (a sum of k² terms, a division by k², a division by the scale, each within 2^-24)
_EPS = 2.0 ** -23


@dataclass
class TruncParams:
    """A Trunc node's constant parameters (float32 arrays as stored) and attributes."""

    version: int
    scale: np.ndarray
    zeropoint: np.ndarray
    in_bits: np.ndarray
    out_scale: np.ndarray | None
    out_bits: int
    signed: bool
    narrow: bool
    rounding_mode: str


def trunc_params(model: "Model", node: ir.Node) -> TruncParams:
    """The parameters of Trunc ``node``; :class:`Unsupported` if one is not a constant or the node is invalid."""
    try:
        op = make_op(node, opset_version=model.graph.opset_imports.get(node.domain, 1))
        version = op.version_for(len(node.inputs))
    except FinnliteError as exc:
        raise Unsupported(f"invalid node: {exc.message}") from None
    scale = positive_scale(const_input(node, 1, "scale"))
    zeropt = const_input(node, 2, "zero-point")
    in_bits = const_input(node, 3, "input bit width", float32=False)
    if version == 1:
        out_scale = None
        out_bits = scalar_int(const_input(node, 4, "output bit width", float32=False), "output bit width")
    else:
        out_scale = positive_scale(const_input(node, 4, "output scale"), "output scale")
        out_bits = scalar_int(const_input(node, 5, "output bit width", float32=False), "output bit width")
    return TruncParams(version, scale, zeropt, in_bits, out_scale, out_bits, op.signed, op.narrow, op.rounding_mode)


def _shift_of(p: TruncParams) -> np.ndarray:
    """The Trunc's divisor 2^shift, computed as the kernel computes it (float32 for float32 parameters)."""
    if p.version == 1:
        return np.asarray(2.0 ** (np.asarray(p.in_bits) - p.out_bits))
    return np.asarray(2 ** np.round(np.log2(p.out_scale / np.asarray(p.scale))))


class _NotThePattern(Exception):
    """The Trunc does not follow an AveragePool at all."""


# -- AveragePool → Trunc ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, eq=False)
class _PoolMatch:
    trunc: ir.Node
    pool: ir.Node
    mul_k2: ir.Node | None
    source: ir.Value
    kernel: int
    stride: int
    ibits: int
    obits: int
    signed: bool
    out_dtype: BaseDataType
    out_mult: np.ndarray


def _ints(node: ir.Node, name: str, default: list[int]) -> list[int]:
    a = node.attributes.get(name)
    return default if a is None else [int(v) for v in a.value]


def _scalar_const(v: ir.Value | None) -> float | None:
    arr = const_array(v)
    if arr is None or arr.size != 1 or arr.dtype != np.float32:
        return None
    return float(arr.reshape(()))


def _scaled_integer_source(model: "Model", u: ir.Value) -> tuple[ir.Value, float, BaseDataType]:
    """(q, s_in, datatype of q) such that ``u = q·s_in`` with q annotated with an integer datatype (``u`` itself
    when it is annotated, s_in = 1); :class:`Unsupported` otherwise."""
    if model.has_tensor_datatype(u.name) and is_integer_type(model.get_tensor_datatype(u.name)):
        return u, 1.0, model.get_tensor_datatype(u.name)
    p = u.producer()
    if p is not None and p.op_type == "Mul" and is_standard_domain(p.domain) and len(p.inputs) == 2:
        for data, param in ((p.inputs[0], p.inputs[1]), (p.inputs[1], p.inputs[0])):
            s_in = _scalar_const(param)
            if s_in is None or not s_in > 0 or data is None or not model.has_tensor_datatype(data.name):
                continue
            dt = model.get_tensor_datatype(data.name)
            if is_integer_type(dt):
                return data, s_in, dt
    raise Unsupported("the AveragePool input is not an integer tensor times a positive scalar")


@equality
@register_pass(group="convert")
class AvgPoolAndTruncToQuantAvgPool(Rule):
    """AveragePool(s_in·q) [→ Mul(k²)] → Trunc  →  QuantAvgPool2d(q) → Mul(output scale).

    Conditions: q carries an integer datatype annotation (the activation conversion provides it) and s_in is a
    positive scalar; the AveragePool is 2-D with a square kernel k, equal strides, no padding, ceil_mode 0 and
    feeds only the Trunc; the Trunc (either version) has constant scalar parameters, zero-point 0, rounding mode
    FLOOR, a power-of-two truncation 2^sh, and (version 2) an output range that never clips. A Trunc with more
    output than input bits multiplies by 2^−sh instead (Brevitas' TruncAvgPool2d with a wide bit_width): that is
    exact, so any rounding mode is accepted, and the QuantAvgPool2d gives the sum S (shift 0, output bits enough
    for it) and the Mul 2^−sh·out_scale. The Trunc scale must
    turn the average back into the window sum: ``r = s_in / (k²·s)`` (``s_in / s`` with the Mul) equal to 1 within a
    margin that covers float32 rounding of the average, so that its first rounding yields S = Σq exactly.

    Algebra: Trunc = (floor(clip(S / 2^sh)) − 0)·out_scale (version 1: ·s) and QuantAvgPool2d = S >> shift with
    shift = bitlen((2^ibits − 1)·k²) − obits; ``ibits`` is the input's bit width when that gives shift = sh,
    else the smallest width that does. The result differs from the original only in the sign of a zero result.
    """

    op_types = ("Trunc",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_custom(node, "Trunc"):
            return None
        try:
            return self._match(model, node)
        except _NotThePattern:
            return None  # not a near miss: ConvertTruncToMultiThreshold takes it
        except Unsupported as exc:
            return self.miss(node, str(exc))

    def _match(self, model: "Model", node: ir.Node) -> _PoolMatch:
        x = node.inputs[0]
        prod = x.producer() if x is not None else None
        mul_k2 = None
        if prod is not None and prod.op_type == "Mul" and is_standard_domain(prod.domain):
            mul_k2, prod = prod, prod.inputs[0].producer() if prod.inputs[0] is not None else None
        if prod is None or prod.op_type != "AveragePool" or not is_standard_domain(prod.domain):
            raise _NotThePattern
        pool = prod
        if len(pool.outputs[0].uses()) != 1 or pool.outputs[0].is_graph_output():
            raise Unsupported("the AveragePool output has other consumers")
        if mul_k2 is not None and (len(mul_k2.outputs[0].uses()) != 1 or mul_k2.outputs[0].is_graph_output()):
            raise Unsupported("the Mul between AveragePool and Trunc has other consumers")
        kernel_shape = _ints(pool, "kernel_shape", [])
        strides = _ints(pool, "strides", [1] * len(kernel_shape))
        if len(kernel_shape) != 2 or kernel_shape[0] != kernel_shape[1] or len(set(strides)) != 1:
            raise Unsupported("the AveragePool is not 2-D with a square kernel and equal strides")
        if any(_ints(pool, "pads", [0])) or any(d != 1 for d in _ints(pool, "dilations", [1])):
            raise Unsupported("the AveragePool pads or dilates")
        auto_pad = pool.attributes.get("auto_pad")
        if auto_pad is not None and auto_pad.value not in ("NOTSET", "VALID"):
            raise Unsupported("the AveragePool pads (auto_pad)")
        if pool.attributes.get("ceil_mode") is not None and int(pool.attributes["ceil_mode"].value):
            raise Unsupported("the AveragePool uses ceil_mode")
        if rank_of(pool.inputs[0]) not in (None, 4):
            raise Unsupported("the AveragePool input is not NCHW")
        k, stride = kernel_shape[0], strides[0]
        k2 = k * k
        if mul_k2 is not None:
            factor = _scalar_const(mul_k2.inputs[1])
            if factor != float(k2):
                raise Unsupported("the Mul between AveragePool and Trunc is not by k²")
        p = trunc_params(model, node)
        if any(a.size != 1 for a in (p.scale, p.zeropoint, p.in_bits)) or (
                p.out_scale is not None and p.out_scale.size != 1):
            raise Unsupported("the Trunc parameters are not scalars")
        if np.any(p.zeropoint != 0):
            raise Unsupported("the Trunc zero-point is not 0")
        divisor = float(_shift_of(p).reshape(()))
        sh = int(np.round(np.log2(divisor))) if divisor > 0 else 0
        if divisor <= 0 or 2.0 ** sh != divisor:
            raise Unsupported(f"the Trunc divides by {divisor}, not a power of two")
        if sh > 0 and p.rounding_mode != "FLOOR":
            raise Unsupported(f"the Trunc rounds with {p.rounding_mode}, QuantAvgPool2d floors")
        up = max(-sh, 0)  # a left shift (more output bits than the sum has) is exact, whatever the rounding mode
        source, s_in, dt = _scaled_integer_source(model, pool.inputs[0])
        s_t = float(p.scale.reshape(()))
        ratio = s_in / s_t if mul_k2 is not None else s_in / (k2 * s_t)
        imin, imax = int(dt.min()), int(dt.max())
        smax = k2 * max(abs(imin), abs(imax))
        if smax * (abs(ratio - 1.0) + (k2 + 8) * _EPS) >= 0.25:
            raise Unsupported(f"the Trunc scale does not recover the window sum exactly (ratio {ratio!r})")
        lo, hi = ((k2 * imin) >> sh, (k2 * imax) >> sh) if sh >= 0 else ((k2 * imin) << up, (k2 * imax) << up)
        obits = p.out_bits
        out_lo, out_hi = min_int(p.signed, p.narrow, obits), max_int(p.signed, p.narrow, obits)
        if p.version == 2 and not (out_lo <= lo and hi <= out_hi):
            raise Unsupported("the Trunc's output range would clip the shifted sums")
        signed = bool(dt.signed())
        if up:  # QuantAvgPool2d gives the sum itself (shift 0), the Mul applies 2^up·out_scale
            sh, lo, hi = 0, k2 * imin, k2 * imax
            obits = next(b for b in range(2, 34) if avgpool_shift(k, dt.bitwidth(), b) == 0 and
                         (DataType[f"{'INT' if signed else 'UINT'}{b}"].min() <= lo and
                          hi <= DataType[f"{'INT' if signed else 'UINT'}{b}"].max()))
        if not 2 <= obits <= 32:
            raise Unsupported(f"QuantAvgPool2d needs 2 to 32 output bits, not {obits}")
        out_dtype = DataType[f"{'INT' if signed else 'UINT'}{obits}"]
        if not (out_dtype.min() <= lo and hi <= out_dtype.max()):
            raise Unsupported(f"the shifted sums [{lo}, {hi}] do not fit {out_dtype.name}")
        candidates = [dt.bitwidth()] + list(range(1, 33))
        ibits = next((b for b in candidates if avgpool_shift(k, b, obits) == sh), None)
        if ibits is None:
            raise Unsupported(f"no QuantAvgPool2d ibits gives the shift {sh}")
        out_mult = (p.scale if p.version == 1 else p.out_scale) * np.float32(2.0 ** up)  # exact: a power of two
        return _PoolMatch(node, pool, mul_k2, source, k, stride, int(ibits), obits, signed, out_dtype,
                          np.asarray(out_mult, dtype=np.float32).reshape(()))

    def rewrite(self, model: "Model", m: _PoolMatch) -> None:
        ensure_custom_domain(model)
        y = m.trunc.outputs[0]
        base = m.trunc.name or y.name
        qap_out = model.make_value_like(y, prefix=f"{base}_qap")
        attrs = [ir.AttrInt64("stride", m.stride), ir.AttrInt64("kernel", m.kernel), ir.AttrInt64("ibits", m.ibits),
                 ir.AttrInt64("obits", m.obits), ir.AttrInt64("signed", int(m.signed)),
                 ir.AttrString("data_layout", "NCHW")]
        qap = ir.Node(QONNX_DOMAIN, "QuantAvgPool2d", [m.source], attributes=attrs, outputs=[qap_out],
                      name=f"{base}_QuantAvgPool2d")
        new_nodes = [qap]
        cur = qap_out
        if float(m.out_mult) != 1.0:
            c = add_constant(model, m.out_mult, prefix=f"{base}_scale", datatype=FLOAT32)
            cur = model.make_value_like(y, prefix=f"{base}_scaled")
            new_nodes.append(ir.Node("", "Mul", [qap_out, c], outputs=[cur], name=f"{base}_Mul"))
        model.graph.insert_after(m.trunc, new_nodes)
        annotate(qap_out, m.out_dtype)
        if cur is not qap_out:
            annotate(cur, FLOAT32)
        take_over(model, y, cur)
        leftovers = list(m.trunc.inputs[1:]) + list(m.pool.inputs)
        model.remove_node(m.trunc)
        if m.mul_k2 is not None:
            leftovers += list(m.mul_k2.inputs[1:])
            model.remove_node(m.mul_k2)
        model.remove_node(m.pool)
        drop_unused(model, leftovers)


# -- any other Trunc → MultiThreshold --------------------------------------------------------------------------------
def trunc_step(model: "Model", node: ir.Node, max_bits: int) -> StepQuantizer:
    """The :class:`StepQuantizer` of a version-2 Trunc with constant parameters."""
    p = trunc_params(model, node)
    if p.version != 2:
        raise Unsupported("a version-1 Trunc does not clip, so its levels are unbounded; only the "
                          "AveragePool pattern converts it")
    if p.out_bits > max_bits:
        raise BitLimit(f"{p.out_bits}-bit Trunc exceeds max_threshold_bits={max_bits}")
    assert p.out_scale is not None
    ch = channels_of([p.scale, p.zeropoint, p.out_scale], rank_of(node.inputs[0]))
    check_threshold_count(p.out_bits, ch.count, max_bits, "Trunc")
    s_c, z_c, os_c = ch.column(p.scale), ch.column(p.zeropoint), ch.column(p.out_scale)
    qmin, qmax = min_int(p.signed, p.narrow, p.out_bits), max_int(p.signed, p.narrow, p.out_bits)
    in_bits, out_bits = p.in_bits, np.asarray(p.out_bits)

    def f(x: np.ndarray) -> np.ndarray:
        return trunc_v2(x, s_c, z_c, in_bits, os_c, out_bits, p.signed, p.narrow, p.rounding_mode)

    shift = np.asarray(2 ** np.round(np.log2(os_c / s_c)))
    zt = np.asarray(z_c / shift)
    addend, add_dtype = None, FLOAT32
    if np.any(zt != 0):
        addend = np.negative(zt).astype(np.float32)
        if np.all(zt == np.round(zt)):
            add_dtype = smallest_int_type(qmin - int(zt.max()), qmax - int(zt.min()))
    mult = None if np.all(os_c == 1) else os_c
    return StepQuantizer(f"{p.out_bits}-bit Trunc", f, ch, qmax - qmin, 1.0, float(qmin), addend, mult,
                         smallest_int_type(qmin, qmax), add_dtype)


@equality
@dataclass(frozen=True, slots=True, eq=False)
class TruncSteps:
    """A Trunc (``node``) as the step quantizer ``quantizer``, and its ``thresholds``."""

    node: ir.Node
    quantizer: Any
    thresholds: Any


@register_pass(group="convert")
class ConvertTruncToMultiThreshold(Rule):
    """Trunc (version 2) → MultiThreshold(x, T; 1, qmin) [→ Add(−z/2^sh)] → Mul(output scale).

    For Truncs the AveragePool pattern did not take. Conditions: constant float32 scale, zero-point and output
    scale varying along at most one axis, output bit width at most ``max_threshold_bits``. Algebra: the Trunc is a
    non-decreasing step function of its float32 input with levels qmin..qmax (its output clip); thresholds are found
    and proven with the Trunc kernel as for a Quant (:mod:`streamline.thresholds`). A version-1 Trunc is reported.
    """

    op_types = ("Trunc",)

    def __init__(self, max_threshold_bits: int = DEFAULT_MAX_THRESHOLD_BITS, max_rewrites: int | None = None) -> None:
        super().__init__(max_rewrites)
        self.max_threshold_bits = max_threshold_bits

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_custom(node, "Trunc") or node.inputs[0] is None:
            return None
        try:
            q = trunc_step(model, node, self.max_threshold_bits)
            return TruncSteps(node, q, solve_thresholds(q))
        except Unsupported as exc:
            if isinstance(exc, BitLimit):
                log.warning("%s: %s; left as a Trunc", node.name, exc)
            return self.miss(node, str(exc))

    def rewrite(self, model: "Model", m: TruncSteps) -> None:
        emit_multithreshold(model, m.node, m.node.inputs[0], m.quantizer, m.thresholds)
