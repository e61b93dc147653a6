"""Activation quantizers → MultiThreshold, exact on every float32 input.

A quantizer whose data input is not a constant (an *activation* quantizer) is replaced by

    MultiThreshold(x, T; out_scale, out_bias) [→ Add(−z)] [→ Mul(s)]

where the MultiThreshold's count ``c`` (the number of thresholds ``x`` reaches) becomes the quantizer's integer
``q = out_scale·c + out_bias``, and the Add/Mul apply ``y = (q − z)·s`` in the kernel's own order of operations, so the
chain's output is bit-identical to the quantizer's (see :mod:`streamline.thresholds` for how ``T`` is found and
proven). The MultiThreshold reads the *same float32 tensor* the quantizer read: whatever precedes the quantizer
(nothing, BatchNormalization, Add/Mul, Sigmoid, Tanh, any op at all) stays a node, so no float32 rounding changes;
absorbing predecessors into thresholds is left to the streamlining stage, which works in exact arithmetic. The one
exception is a Relu or a Clip with constant bounds feeding only this quantizer: both are reproduced exactly by numpy,
so they are absorbed when the composite's thresholds are all finite (typically Relu before an unsigned quantizer,
which leaves the thresholds unchanged) and kept as nodes otherwise.

FINN's converter (``ConvertQuantActToMultiThreshold`` and its handlers) puts thresholds at ``(k + ½)·s`` for every
rounding mode, which is wrong for ties under ROUND (half to even) and for FLOOR/CEIL/UP/DOWN; lowers a 1-bit unsigned
quantizer as bipolar; and annotates the MultiThreshold output with the quantizer's signed type before adding the
bias, so it holds 0..2^b−1 under an INTb annotation. Here the thresholds come from the kernel itself, 1-bit signed
is BIPOLAR (out_scale 2, out_bias −1) and 1-bit unsigned BINARY, and the bias is inside the MultiThreshold
(``out_bias``), whose output annotation is the type of the values it really holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import onnx_ir as ir

from custom_ops.bipolar_quant import bipolar_quant
from custom_ops.quant import max_int, min_int, quant
from custom_ops.registry import QONNX_DOMAIN, is_standard_domain
from finnlite.core.datatypes import BaseDataType, DataType, int_type, smallest_int_type
from finnlite.core.graphutil import add_constant, annotate, clip_bounds, ensure_custom_domain, rank_of, take_over
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.convert_common import (DEFAULT_MAX_THRESHOLD_BITS, FLOAT32, QUANT_OPS, BitLimit, Channels,
                                       Unsupported, channels_of, check_threshold_count, const_input, custom_op,
                                       drop_unused, is_custom, layout_for, positive_scale,
                                       scalar_int)
from streamline.real_thresholds import RealThresholds, quant_real_thresholds, set_real_thresholds
from streamline.thresholds import StepFunction, check_thresholds, float32_to_key, least_float32_reaching
from finnlite.core.policies import equality

if TYPE_CHECKING:
    from finnlite.core.model import Model

log = logging.getLogger(__name__)


@dataclass
class StepQuantizer:
    """A quantizer as a per-channel step function and the MultiThreshold chain that reproduces it.

    ``f`` evaluates the op's kernel on a (channels, k) float32 array (row c with channel c's parameters). The chain
    is ``MultiThreshold(out_scale, out_bias)`` with ``n_thresholds`` thresholds per channel, then ``+ addend`` and
    ``· mult`` (per-channel (C, 1) float32 arrays, None to omit the node); ``mt_dtype`` and ``add_dtype`` annotate
    the MultiThreshold and Add outputs. ``estimate`` holds real-arithmetic threshold guesses (C, N), or None."""

    what: str
    f: StepFunction
    channels: Channels
    n_thresholds: int
    out_scale: float
    out_bias: float
    addend: np.ndarray | None
    mult: np.ndarray | None
    mt_dtype: BaseDataType
    add_dtype: BaseDataType
    estimate: np.ndarray | None = None
    #: the exact real-number thresholds (:mod:`streamline.real_thresholds`) the streamliner continues from
    real: RealThresholds | None = None

    def table(self) -> np.ndarray:
        """The chain's output for each count 0..N, per channel: (C, N + 1) float32, computed with the operations
        the MultiThreshold kernel and the Add/Mul nodes perform."""
        counts = np.arange(self.n_thresholds + 1, dtype=np.float32)[None, :]
        v = np.float32(self.out_scale) * counts + np.float32(self.out_bias)
        v = np.broadcast_to(v, (self.channels.count, self.n_thresholds + 1))
        if self.addend is not None:
            v = v + self.addend
        if self.mult is not None:
            v = v * self.mult
        return np.ascontiguousarray(v, dtype=np.float32)


def solve_thresholds(q: StepQuantizer, pre: Callable[[np.ndarray], np.ndarray] | None = None,
                     finite: bool = False) -> np.ndarray:
    """The proven thresholds (C, N) of ``q`` (composed with the elementwise ``pre`` if given);
    :class:`Unsupported` if the levels are not distinct in float32, a level is never reached, the proof fails, or
    (``finite``) a threshold is infinite."""
    table = q.table()
    keys = float32_to_key(table)
    if table.shape[1] > 1 and not np.all(np.diff(keys, axis=1) > 0):
        raise Unsupported("the output levels are not distinct in float32")
    f = q.f if pre is None else (lambda x: q.f(pre(x)))
    thresholds, reachable = least_float32_reaching(f, table, q.estimate)
    if not reachable.all():
        raise Unsupported("some output level is never reached")
    if finite and not np.all(np.isfinite(thresholds)):
        raise Unsupported("some threshold is infinite")
    problem = check_thresholds(f, table, thresholds)
    if problem is not None:
        raise Unsupported(f"threshold proof failed ({problem})")
    return thresholds


# -- quantizers as step functions ------------------------------------------------------------------------------
def _real_boundary(q: np.ndarray, mode: str) -> np.ndarray:
    """The real ``v`` at which rounding mode ``mode`` starts giving ``q`` (up to ties)."""
    if mode in ("ROUND", "HALF_EVEN", "HALF_UP", "HALF_DOWN"):
        return q - 0.5
    if mode == "FLOOR":
        return q
    if mode == "CEIL":
        return q - 1.0
    if mode == "UP":
        return np.where(q > 0, q - 1.0, q)
    return np.where(q > 0, q, q - 1.0)  # DOWN


def quant_step(node: ir.Node, max_bits: int) -> StepQuantizer:
    """The :class:`StepQuantizer` of a Quant node with constant scale, zero-point and bit width."""
    op = custom_op(node)
    scale = positive_scale(const_input(node, 1, "scale"))
    zeropt = const_input(node, 2, "zero-point")
    bitwidth = const_input(node, 3, "bit width", float32=False)
    bits = scalar_int(bitwidth, "bit width")
    if bits > max_bits:
        raise BitLimit(f"{bits}-bit quantizer exceeds max_threshold_bits={max_bits} "
                       f"({2 ** bits - 1} thresholds per channel)")
    ch = channels_of([scale, zeropt], rank_of(node.inputs[0]))
    check_threshold_count(bits, ch.count, max_bits)
    s_c, z_c = ch.column(scale), ch.column(zeropt)
    signed, narrow, mode = op.signed, op.narrow, op.rounding_mode
    bipolar = bits == 1 and signed
    qmin, qmax = (-1, 1) if bipolar else (min_int(signed, narrow, bits), max_int(signed, narrow, bits))
    out_scale = 2.0 if bipolar else 1.0
    n = 1 if bipolar else qmax - qmin
    if n == 0:
        raise Unsupported("a single-level quantizer (1-bit unsigned narrow) is a constant, not converted")
    exact_type = int_type(bits, signed)  # BIPOLAR / BINARY for one bit

    def f(x: np.ndarray) -> np.ndarray:
        return quant(x, s_c, z_c, bitwidth, signed, narrow, mode)

    integer_z = bool(np.all(zeropt == np.round(zeropt)))
    addend, add_dtype = None, FLOAT32
    if integer_z and zeropt.size == 1:
        zv = int(zeropt.reshape(-1)[0])
        out_bias = float(qmin - zv)
        mt_dtype = exact_type if zv == 0 else smallest_int_type(qmin - zv, qmax - zv)
    else:
        out_bias = float(qmin)
        mt_dtype = exact_type
        if np.any(zeropt != 0):
            addend = np.negative(z_c)
            if integer_z:
                add_dtype = smallest_int_type(qmin - int(z_c.max()), qmax - int(z_c.min()))
    mult = None if np.all(scale == 1) else s_c
    q_levels = (np.array([1.0]) if bipolar else np.arange(qmin + 1, qmax + 1, dtype=np.float64))[None, :]
    v_star = np.zeros_like(q_levels) if bipolar else _real_boundary(q_levels, mode)
    estimate = (v_star - z_c.astype(np.float64)) * s_c.astype(np.float64)
    real = quant_real_thresholds(s_c.ravel(), z_c.ravel(), bits, signed, narrow, mode)
    return StepQuantizer(f"{bits}-bit {'signed' if signed else 'unsigned'} Quant", f, ch, n, out_scale, out_bias,
                         addend, mult, mt_dtype, add_dtype, estimate, real)


def bipolar_quant_step(node: ir.Node) -> StepQuantizer:
    """The :class:`StepQuantizer` of a BipolarQuant node with a constant scale."""
    custom_op(node)
    scale = positive_scale(const_input(node, 1, "scale"))
    ch = channels_of([scale], rank_of(node.inputs[0]))
    s_c = ch.column(scale)

    def f(x: np.ndarray) -> np.ndarray:
        return bipolar_quant(x, s_c)

    mult = None if np.all(scale == 1) else s_c
    return StepQuantizer("BipolarQuant", f, ch, 1, 2.0, -1.0, None, mult, DataType["BIPOLAR"], FLOAT32,
                         np.zeros((ch.count, 1)), RealThresholds(np.zeros((1, 1)), np.zeros((1, 1), dtype=bool)))


# -- predecessors that are absorbed ------------------------------------------------------------------------------
def absorbable_predecessor(model: "Model", x: ir.Value
                           ) -> tuple[ir.Node, Callable[[np.ndarray], np.ndarray], tuple[float, float]] | None:
    """A Relu, or a Clip with constant float32 bounds, producing ``x`` for this consumer only, with the numpy
    function that computes it exactly (``max`` and ``min`` are exact in IEEE arithmetic) and its bounds; else
    None."""
    p = x.producer()
    if p is None or not is_standard_domain(p.domain) or len(x.uses()) != 1 or x.is_graph_output():
        return None
    if p.op_type == "Relu":
        return p, lambda v: np.maximum(v, np.float32(0.0)), (0.0, np.inf)
    if p.op_type != "Clip":
        return None
    found = clip_bounds(p)
    if found is None or any(b is not None and b.dtype != np.float32 for b in found):
        return None
    bounds = [np.float32(d if b is None else b) for b, d in zip(found, (-np.inf, np.inf))]
    lo, hi = bounds
    if not lo <= hi:
        return None
    return p, lambda v: np.minimum(np.maximum(v, lo), hi), (float(lo), float(hi))


def narrowed(q: StepQuantizer, pre: Callable[[np.ndarray], np.ndarray]) -> StepQuantizer:
    """``q`` restricted to the levels it can reach behind ``pre`` (a Relu or Clip): ``c_lo`` levels that every
    input passes go into ``out_bias``, the levels above the one ``pre``'s upper bound reaches are dropped. So a
    Clip that narrows a quantizer's range (a Relu before a signed quantizer, an imported QDQ range such as
    [−141, 114] inside INT9) keeps ``c_hi − c_lo`` finite thresholds instead of unreachable ones. ``q`` itself
    where nothing narrows, where the reached counts differ per channel, or for a chain with a per-channel Add or
    out_scale ≠ 1 (the MultiThreshold's datatype is then re-derived from the narrowed range of counts)."""
    if q.addend is not None or q.out_scale != 1.0:
        return q
    big = np.finfo(np.float32).max
    with np.errstate(over="ignore"):
        ends = q.f(pre(np.broadcast_to(np.array([[-big, big]], np.float32), (q.channels.count, 2)).copy()))
    keys, table = float32_to_key(ends), float32_to_key(q.table())
    counts = []
    for j in (0, 1):
        hit = table == keys[:, j:j + 1]
        if not np.all(hit.any(axis=1)):
            return q
        found = np.unique(hit.argmax(axis=1))
        if found.size != 1:
            return q
        counts.append(int(found[0]))
    c_lo, c_hi = counts
    if (c_lo, c_hi) == (0, q.n_thresholds) or c_hi <= c_lo:
        return q
    out_bias = q.out_bias + c_lo
    real = q.real
    if real is not None:
        full = real._full() if hasattr(real, "_full") else real
        real = RealThresholds(full.base[:, c_lo:c_hi], full.strict[:, c_lo:c_hi], full.alpha, full.beta)
    estimate = None if q.estimate is None else np.ascontiguousarray(
        np.broadcast_to(q.estimate, (q.estimate.shape[0], q.n_thresholds))[:, c_lo:c_hi])
    return StepQuantizer(f"{q.what} narrowed to counts {c_lo}..{c_hi}", q.f, q.channels, c_hi - c_lo, 1.0,
                         out_bias, None, q.mult, smallest_int_type(out_bias, out_bias + c_hi - c_lo),
                         q.add_dtype, estimate, real)


# -- emitting the MultiThreshold chain ----------------------------------------------------------------------------
def emit_multithreshold(model: "Model", node: ir.Node, x_in: ir.Value, q: StepQuantizer, thresholds: np.ndarray,
                        remove: tuple[ir.Node, ...] = ()) -> ir.Node:
    """Replace ``node`` (one output) by the chain of ``q`` reading ``x_in``; remove ``node`` and then ``remove``.
    The last node of the chain takes over the output's name. Returns the MultiThreshold node."""
    ensure_custom_domain(model)
    per_channel = thresholds.shape[0] > 1
    if per_channel and np.all(float32_to_key(thresholds) == float32_to_key(thresholds[:1])):
        thresholds = thresholds[:1]
    y = node.outputs[0]
    base = node.name or y.name
    t_init = add_constant(model, np.ascontiguousarray(thresholds, dtype=np.float32), prefix=f"{base}_thresholds",
                          datatype=FLOAT32)
    attrs: list[Any] = [ir.AttrString("out_dtype", q.mt_dtype.name), ir.AttrFloat32("out_scale", q.out_scale),
                        ir.AttrFloat32("out_bias", q.out_bias)]
    if q.channels.axis is not None and per_channel:  # (also when the rows are equal in float32: the exact real
        assert q.channels.rank is not None          # thresholds keep one row per channel along this axis)
        attrs.append(ir.AttrString("data_layout", layout_for(q.channels.axis, q.channels.rank)))
    cur = model.make_value_like(y, prefix=f"{base}_mt")
    mt = ir.Node(QONNX_DOMAIN, "MultiThreshold", [x_in, t_init], attributes=attrs, outputs=[cur],
                 name=f"{base}_MultiThreshold")
    annotations = [(cur, q.mt_dtype)]
    new_nodes = [mt]
    for op_type, param, dtype in (("Add", q.addend, q.add_dtype), ("Mul", q.mult, FLOAT32)):
        if param is None:
            continue
        c = add_constant(model, q.channels.shaped(param).astype(np.float32), prefix=f"{base}_{op_type.lower()}",
                         datatype=FLOAT32)
        out = model.make_value_like(y, prefix=f"{base}_{op_type.lower()}_out")
        new_nodes.append(ir.Node("", op_type, [cur, c], outputs=[out], name=f"{base}_{op_type}"))
        annotations.append((out, dtype))
        cur = out
    model.graph.insert_after(node, new_nodes)
    for value, dtype in annotations:
        annotate(value, dtype)
    take_over(model, y, cur)
    params = list(node.inputs[1:])
    model.remove_node(node)
    for extra in remove:
        model.remove_node(extra)
    drop_unused(model, params)
    return mt


@dataclass(frozen=True, slots=True, eq=False)
class _ActMatch:
    node: ir.Node
    x_in: ir.Value
    quantizer: StepQuantizer
    thresholds: np.ndarray
    absorbed: tuple[ir.Node, ...]
    clip: tuple[float, float] | None = None


class _QuantActToMultiThreshold(Rule):
    """Shared matcher of the two activation rules (see the subclasses)."""

    def __init__(self, max_threshold_bits: int = DEFAULT_MAX_THRESHOLD_BITS, absorb_relu: bool = True,
                 max_rewrites: int | None = None) -> None:
        super().__init__(max_rewrites)
        self.max_threshold_bits = max_threshold_bits
        self.absorb_relu = absorb_relu

    #: the quantizer of a node as a step function (set by the subclasses)
    step: Callable[[Any, ir.Node], StepQuantizer]

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_custom(node, *self.op_types) or node.inputs[0] is None:
            return None
        if const_array(node.inputs[0]) is not None:
            return None  # a weight quantizer: FoldQuantWeights' job
        try:
            q = self.step(node)
        except Unsupported as exc:
            if isinstance(exc, BitLimit):
                log.warning("%s: %s; left as a quantizer", node.name, exc)
            return self.miss(node, str(exc))
        x = node.inputs[0]
        if self.absorb_relu:
            pre = absorbable_predecessor(model, x)
            if pre is not None:
                try:
                    qn = narrowed(q, pre[1])
                    t = solve_thresholds(qn, pre[1], finite=True)
                    return _ActMatch(node, pre[0].inputs[0], qn, t, (pre[0],), pre[2])
                except Unsupported:
                    pass  # keep the predecessor as a node
        try:
            t = solve_thresholds(q)
        except Unsupported as exc:
            return self.miss(node, str(exc))
        return _ActMatch(node, x, q, t, ())

    def rewrite(self, model: "Model", m: _ActMatch) -> None:
        mt = emit_multithreshold(model, m.node, m.x_in, m.quantizer, m.thresholds, m.absorbed)
        real = m.quantizer.real
        if real is not None:
            if m.clip is not None:
                real = real.clip_composed(*m.clip)
            set_real_thresholds(mt, real)


@equality
@register_pass(group="convert")
class ConvertQuantActToMultiThreshold(_QuantActToMultiThreshold):
    """Quant(x, s, z, b) with x not constant  →  MultiThreshold(x, T; 1, qmin − z) [→ Add(−z)] [→ Mul(s)].

    Conditions: scale, zero-point and bit width are constants (scale and zero-point float32, scale > 0, varying along
    at most one axis of x, which becomes the MultiThreshold's channel axis), the bit width is at most
    ``max_threshold_bits`` (default 16: 65535 thresholds per channel) and all its thresholds at most 2^20 (wider
    quantizers are left in place with a warning and a miss). Any rounding mode, signed/unsigned, narrow, any zero-point.

    Algebra: the quantizer is a non-decreasing step function of x with levels q = qmin..qmax (−1, +1 for one signed
    bit, where out_scale is 2); ``T[c, m]`` is the least float32 input whose level is ≥ qmin + m, found by bisection
    over float32 values with the Quant kernel and proven at every switching point (:mod:`streamline.thresholds`).
    An integer scalar zero-point is folded into ``out_bias`` (the MultiThreshold then outputs q − z); a per-channel
    or fractional one becomes ``Add(−z)``, which computes ``q − z`` exactly as the kernel does. ``Mul(s)`` (omitted
    when s = 1) then gives ``(q − z)·s`` bit for bit. Annotations: the MultiThreshold output gets the quantizer's
    exact type (INTb/UINTb, BIPOLAR for 1-bit signed, BINARY for 1-bit unsigned; the range type of q − z for z ≠ 0).
    A Relu or constant Clip feeding only this quantizer is absorbed when all resulting thresholds are finite; levels
    it makes unreachable are dropped (:func:`narrowed`).
    """

    op_types = QUANT_OPS

    def step(self, node: ir.Node) -> StepQuantizer:
        return quant_step(node, self.max_threshold_bits)


@equality
@register_pass(group="convert")
class ConvertBipolarQuantActToMultiThreshold(_QuantActToMultiThreshold):
    """BipolarQuant(x, s) with x not constant  →  MultiThreshold(x, [[0.0]]; 2, −1) [→ Mul(s)].

    Conditions: a constant float32 scale > 0 (per tensor or along one axis). Algebra: the kernel outputs
    s·(+1 if x ≥ 0 else −1) (−0.0 counts as ≥ 0, as does the MultiThreshold's comparison with threshold +0.0), so
    count c ∈ {0, 1} gives 2c − 1 ∈ {−1, +1}, annotated BIPOLAR; ``Mul(s)`` is omitted when s = 1. The threshold
    is found and proven like a Quant's."""

    op_types = ("BipolarQuant",)

    def step(self, node: ir.Node) -> StepQuantizer:
        return bipolar_quant_step(node)
