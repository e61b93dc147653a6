"""Exact lowerings of custom ops to standard ONNX ops, for the executor's fast path.

A quantized network has a Quant (or MultiThreshold) after nearly every layer; running those as numpy kernels between
onnxruntime sessions would dominate the run time. Each function here rewrites one custom node into standard nodes
that compute **bit for bit** what its reference kernel (``custom_ops.quant`` etc., themselves bit-identical to
qonnx) computes — the same float operations in the same order on the same dtype — so that the node can run inside
an onnxruntime session:

* ``Quant`` / ``IntQuant``: ``Div(x, s) → Add(z) → Clip(qmin, qmax) → R → Sub(z) → Mul(s)``. ``Clip`` with scalar
  bounds reproduces the kernel's ``where(v > max, max, v)``, ``where(v < min, min, v)``, signed zeros and NaN
  included. ``R`` is ``Round`` (half to even, like ``np.round``) for ROUND/HALF_EVEN, ``Floor``/``Ceil``, and
  the kernel's ``Sign``/``Abs`` compositions for UP, HALF_UP and HALF_DOWN. DOWN (``np.fix``) runs the kernel:
  it yields −0.0 on (−1, 0), and onnxruntime's ``Where`` turns a selected −0.0 into +0.0. A signed 1-bit Quant
  is bipolar: ``Where(v ≥ 0, 1, −1)``. With a constant +0 zero point the Sub is left out (``v − (+0)`` is ``v``
  bit for bit, and ``v`` already has the broadcast shape); the Add stays, since ``−0 + 0`` is ``+0``.
* ``BipolarQuant``: ``Mul(Where(x ≥ 0, 1, −1), s)``.
* ``MultiThreshold``: ``Cast(GreaterOrEqual(Unsqueeze(x, 0), T'))`` summed over axis 0 by a ``MatMul`` with ones,
  ``T`` transposed to (steps, channels) and reshaped to broadcast along the channel axis, then
  ``Mul(out_scale)``/``Add(out_bias)`` unless 1 and 0 (the count is a non-negative integer, so ``1·n + 0`` is
  ``n``). Only for small inputs (:data:`MT_KERNEL_COMPARISONS`): the kernel counts large ones faster.
* ``Trunc`` (v1, v2): ``Div, Add, Round, Div(shift), [Clip for v2], R, Sub, Mul`` with the shift (and v2's shifted
  zero point) computed at plan time in numpy, exactly as the kernel computes them.
* ``Im2Col``: ``[Pad(pad_value)]`` then one strided ``Slice`` per kernel position, concatenated on the channel axis in
  (a, b, c) order: pure data movement, for a float input of static spatial size.

A node is lowered only when the result is certain to be exact: the parameters that shape the computation (bit
widths, thresholds, Trunc's scales) are constants, every constant float parameter has the executor's dtype (numpy
would otherwise promote and the kernel compute in another type), thresholds match the channel count statically,
and the opset is at least 11. Otherwise :class:`NotLowerable` says why and the executor runs the kernel. Constant
parameters are validated with the op's own ``validate_inputs`` (so a bad scale raises the kernel's
:class:`~finnlite.core.errors.OpError`, at plan time). ``tests/custom_ops/test_executor_lowering.py`` proves every
lowering equal to its kernel, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import onnx
from onnx import helper

from custom_ops.base import CustomOp
from custom_ops.quant import max_int, min_int

#: the least default-domain opset the lowerings are written for (Clip with bound inputs, Round, Equal on floats)
MIN_OPSET = 11

#: a MultiThreshold making at least this many comparisons (elements x steps, batch 1) runs its numpy kernel: it
#: counts threshold by threshold into a byte counter, faster than the lowering below for large nodes; under it,
#: the lowering keeps the node inside its region and saves a session boundary
MT_KERNEL_COMPARISONS = 1 << 18

Shape = tuple[Any, ...]


class NotLowerable(Exception):
    """A custom node has no exact standard-op lowering in this context; the message says why."""


@dataclass
class Lowering:
    """Standard nodes replacing one custom node (the last one writes the node's output), and the new constants
    they read, by name. The custom node's own inputs keep their names."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class LoweringContext:
    """What a lowering may know about the graph around the node: ``constants`` (initializers and folded tensors),
    static ``shapes`` where known (dims may be None), the executor's float ``dtype``, the default-domain
    ``opset``, and ``fresh(hint)``, which returns a name not used in the graph."""

    constants: Mapping[str, np.ndarray]
    shapes: Mapping[str, Shape]
    dtype: np.dtype
    opset: int
    fresh: Callable[[str], str]
    types: Mapping[str, int] = field(default_factory=dict)  # ONNX element types where known


class Emitter:
    """Builds the standard nodes of one lowering, with fresh names derived from the custom node's."""

    def __init__(self, node: onnx.NodeProto, ctx: LoweringContext) -> None:
        self.node, self.ctx = node, ctx
        self.stem = node.output[0]
        self.result = Lowering()

    def const(self, value: Any, hint: str, dtype: Any = None) -> str:
        """A new constant (in the executor's dtype unless ``dtype`` is given)."""
        name = self.ctx.fresh(f"{self.stem}__{hint}")
        self.result.constants[name] = np.asarray(value, dtype=dtype if dtype is not None else self.ctx.dtype)
        return name

    def op(self, op_type: str, inputs: Iterable[str], output: str | None = None, **attrs: Any) -> str:
        """A new node; returns its (fresh, unless given) output name."""
        out = output if output is not None else self.ctx.fresh(f"{self.stem}__{op_type.lower()}")
        name = self.ctx.fresh(f"{self.node.name or self.stem}__{op_type}")
        self.result.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    # opset-dependent forms
    def greater_or_equal(self, a: str, b: str) -> str:
        if self.ctx.opset >= 12:
            return self.op("GreaterOrEqual", [a, b])
        # Or(Greater, Equal) keeps NaN >= t false, as numpy does (Not(Less) would not)
        return self.op("Or", [self.op("Greater", [a, b]), self.op("Equal", [a, b])])

    def unsqueeze_first(self, x: str) -> str:
        if self.ctx.opset >= 13:
            return self.op("Unsqueeze", [x, self.const([0], "axes", np.int64)])
        return self.op("Unsqueeze", [x], axes=[0])



# -- helpers --------------------------------------------------------------------------------------------------
def _inputs(node: onnx.NodeProto, counts: Iterable[int]) -> None:
    if len(node.input) not in tuple(counts) or not all(node.input):
        raise NotLowerable(f"{node.op_type} with inputs {list(node.input)}")


def _constant(ctx: LoweringContext, node: onnx.NodeProto, index: int, what: str) -> np.ndarray:
    if node.input[index] not in ctx.constants:
        raise NotLowerable(f"its {what} is not a constant")
    return ctx.constants[node.input[index]]


def _known(ctx: LoweringContext, node: onnx.NodeProto) -> list[np.ndarray | None]:
    """The node's input values where constant (None elsewhere), for the op's ``validate_inputs``."""
    return [ctx.constants.get(t) for t in node.input]


def _check_dtypes(ctx: LoweringContext, node: onnx.NodeProto, indices: Iterable[int]) -> None:
    """Constant float parameters must have the executor's dtype: numpy would promote a mixed computation."""
    for i in indices:
        value = ctx.constants.get(node.input[i])
        if value is not None and value.dtype != ctx.dtype:
            raise NotLowerable(f"input {i} has dtype {value.dtype}, not {ctx.dtype}")


def _is_positive_zero(value: np.ndarray | None) -> bool:
    return value is not None and value.size > 0 and not np.any(value) and not np.any(np.signbit(value))


def _subtract(em: Emitter, y: str, zeropt: str | np.ndarray) -> str:
    """``y - zeropt`` (a tensor name or a new constant); nothing for a constant +0 (see the module docstring)."""
    value = em.ctx.constants.get(zeropt) if isinstance(zeropt, str) else zeropt
    if _is_positive_zero(value):
        return y
    name = zeropt if isinstance(zeropt, str) else em.const(zeropt, "zeropt", zeropt.dtype)
    return em.op("Sub", [y, name])


def _round(em: Emitter, y: str, mode: str) -> str:
    """Rounding mode ``mode`` (canonical name) applied to ``y``, with the kernel's formulas."""
    if mode in ("ROUND", "HALF_EVEN"):
        return em.op("Round", [y])
    if mode == "FLOOR":
        return em.op("Floor", [y])
    if mode == "CEIL":
        return em.op("Ceil", [y])
    if mode == "DOWN":
        # np.fix gives -0.0 on (-1, 0); onnxruntime's Where turns a selected -0.0 into +0.0, and the other
        # compositions (Sign·Floor(Abs), Cast to int) lose the sign of an input -0.0
        raise NotLowerable("rounding mode DOWN keeps signed zeros that onnxruntime's Where does not")
    if mode == "UP":  # sign(v) * ceil(|v|)
        return em.op("Mul", [em.op("Sign", [y]), em.op("Ceil", [em.op("Abs", [y])])])
    if mode == "HALF_UP":  # sign(v) * floor(|v| + 0.5)
        shifted = em.op("Add", [em.op("Abs", [y]), em.const(0.5, "half")])
        return em.op("Mul", [em.op("Sign", [y]), em.op("Floor", [shifted])])
    if mode == "HALF_DOWN":  # sign(v) * ceil(|v| - 0.5)
        shifted = em.op("Sub", [em.op("Abs", [y]), em.const(0.5, "half")])
        return em.op("Mul", [em.op("Sign", [y]), em.op("Ceil", [shifted])])
    raise NotLowerable(f"no lowering for rounding mode '{mode}'")


def _clip(em: Emitter, y: str, signed: bool, narrow: bool, bits: int) -> str:
    """The kernel's ``clip_to_range`` with integer bounds converted to the executor's dtype."""
    return em.op("Clip", [y, em.const(min_int(signed, narrow, bits), "qmin"),
                          em.const(max_int(signed, narrow, bits), "qmax")])


def _bipolar(em: Emitter, y: str) -> str:
    """``where(y >= 0, 1, -1)`` in the executor's dtype."""
    nonneg = em.greater_or_equal(y, em.const(0, "zero"))
    return em.op("Where", [nonneg, em.const(1, "one"), em.const(-1, "minus_one")])


def _bits(value: np.ndarray) -> int:
    return int(np.asarray(value).reshape(()).item())


# -- the lowerings --------------------------------------------------------------------------------------------
def lower_quant(node: onnx.NodeProto, op: Any, ctx: LoweringContext) -> Lowering:
    """Quant(x, s, z, b) → Div, Add, Clip (bipolar Where for signed 1-bit), rounding, Sub, Mul."""
    _inputs(node, (4,))
    bitwidth = _constant(ctx, node, 3, "bitwidth")
    op.validate_inputs(_known(ctx, node))
    _check_dtypes(ctx, node, (1, 2))
    bits = _bits(bitwidth)
    em = Emitter(node, ctx)
    x, scale, zeropt = node.input[0], node.input[1], node.input[2]
    y = em.op("Add", [em.op("Div", [x, scale]), zeropt])
    if bits == 1 and op.signed:
        y = _bipolar(em, y)
    else:
        y = _round(em, _clip(em, y, op.signed, op.narrow, bits), op.rounding_mode)
    em.op("Mul", [_subtract(em, y, zeropt), scale], output=node.output[0])
    return em.result


def lower_bipolar_quant(node: onnx.NodeProto, op: Any, ctx: LoweringContext) -> Lowering:
    """BipolarQuant(x, s) → Mul(Where(x ≥ 0, 1, −1), s)."""
    _inputs(node, (2,))
    op.validate_inputs(_known(ctx, node))
    _check_dtypes(ctx, node, (1,))
    em = Emitter(node, ctx)
    em.op("Mul", [_bipolar(em, node.input[0]), node.input[1]], output=node.output[0])
    return em.result


def lower_multithreshold(node: onnx.NodeProto, op: Any, ctx: LoweringContext) -> Lowering:
    """MultiThreshold(x, T) → MatMul(ones, Cast(GreaterOrEqual(Unsqueeze(x, 0), T'))) reshaped like x, then out_scale and
    out_bias."""
    _inputs(node, (2,))
    thresholds = _constant(ctx, node, 1, "thresholds")
    _check_dtypes(ctx, node, (1,))
    x_shape = ctx.shapes.get(node.input[0])
    if x_shape is None:
        raise NotLowerable(f"the rank of '{node.input[0]}' is unknown")
    op.infer_shapes([x_shape, thresholds.shape], [None, thresholds])  # the kernel's shape checks
    cdim = op.channel_axis(len(x_shape))
    channels, steps = thresholds.shape
    comparisons = steps * int(np.prod([d if isinstance(d, int) and d > 0 else 1 for d in x_shape]))
    if comparisons >= MT_KERNEL_COMPARISONS:
        raise NotLowerable(f"{comparisons} comparisons: the numpy kernel is faster")
    if channels != 1 and x_shape[cdim] != channels:
        raise NotLowerable(f"the channel count of '{node.input[0]}' is not known to be {channels}")
    # the threshold axis goes first: T (C, B) → T' (B, 1, .., C, .., 1) with C on axis 1 + cdim, compared with
    # Unsqueeze(x, 0): each step broadcasts one per-channel vector over x (rather than a trailing threshold axis,
    # an inner loop of B). The hits are summed over axis 0 as MatMul(ones(1, B), hits as (B, -1)) rather than
    # ReduceSum over axis 0; a sum of at most B ones is exact in any order
    shaped = np.ascontiguousarray(thresholds.T).reshape(
        (steps,) + (1,) * cdim + (channels,) + (1,) * (len(x_shape) - 1 - cdim))
    em = Emitter(node, ctx)
    hits = em.greater_or_equal(em.unsqueeze_first(node.input[0]), em.const(shaped, "thresholds"))
    hits = em.op("Cast", [hits], to=int(helper.np_dtype_to_tensor_dtype(ctx.dtype)))
    flat = em.op("Reshape", [hits, em.const([steps, -1], "flat_shape", np.int64)])
    total = em.op("MatMul", [em.const(np.ones((1, steps)), "ones"), flat])
    out = em.op("Reshape", [total, em.op("Shape", [node.input[0]])])
    if op.out_scale != 1.0:
        out = em.op("Mul", [out, em.const(op.out_scale, "out_scale")])
    if op.out_bias != 0.0:
        out = em.op("Add", [out, em.const(op.out_bias, "out_bias")])
    em.op("Identity", [out], output=node.output[0])
    return em.result


def lower_trunc(node: onnx.NodeProto, op: Any, ctx: LoweringContext) -> Lowering:
    """Trunc v1 (x, s, z, in_bits, out_bits) or v2 (x, s, z, in_bits, out_scale, out_bits) → Div, Add, Round,
    Div(shift), [Clip for v2], rounding, Sub, Mul."""
    _inputs(node, (5, 6))
    version = op.version_for(len(node.input))
    op.validate_inputs(_known(ctx, node))
    _check_dtypes(ctx, node, range(1, len(node.input)))
    scale = _constant(ctx, node, 1, "scale")
    zeropt = _constant(ctx, node, 2, "zero-point")
    em = Emitter(node, ctx)
    x = node.input[0]
    y = em.op("Round", [em.op("Add", [em.op("Div", [x, node.input[1]]), node.input[2]])])
    with np.errstate(all="ignore"):
        if version == 1:
            in_bits, out_bits = _constant(ctx, node, 3, "input bitwidth"), _constant(ctx, node, 4, "output bitwidth")
            shift = np.asarray(2.0 ** (np.asarray(in_bits) - np.asarray(out_bits)))
        else:
            out_scale = _constant(ctx, node, 4, "output scale")
            shift = np.asarray(2 ** np.round(np.log2(out_scale / np.asarray(scale))))
            shifted_zeropt = np.asarray(zeropt / shift)
    y = em.op("Div", [y, em.const(shift, "shift", shift.dtype)])
    if version == 1:
        y = _round(em, y, op.rounding_mode)
        em.op("Mul", [_subtract(em, y, node.input[2]), node.input[1]], output=node.output[0])
    else:
        y = _clip(em, y, op.signed, op.narrow, _bits(_constant(ctx, node, 5, "output bitwidth")))
        y = _round(em, y, op.rounding_mode)
        em.op("Mul", [_subtract(em, y, shifted_zeropt), node.input[4]], output=node.output[0])
    return em.result


def lower_im2col(node: onnx.NodeProto, op: Any, ctx: LoweringContext) -> Lowering:
    """Im2Col(x) → [Pad(pad_value)] → one strided Slice per kernel position (a, b) → Concat on the channel axis.

    The windows are copies of input elements and pad values, so any exact data movement computes the kernel's
    result; the Concat of the (a, b) slices, each ``xp[:, a·dh :: sh, b·dw :: sw, :]`` cut to the output size, lays
    every window out in (a, b, c) order as the kernel does. Needs the input's spatial size (static) and the
    executor's float dtype for the input (the pad value is a constant of that dtype)."""
    _inputs(node, (1,))
    x = node.input[0]
    shape = ctx.shapes.get(x)
    if shape is None or len(shape) != 4 or shape[1] is None or shape[2] is None:
        raise NotLowerable(f"the spatial size of '{x}' is not known")
    elem = ctx.types.get(x)
    if elem is not None and elem != helper.np_dtype_to_tensor_dtype(ctx.dtype):
        raise NotLowerable(f"'{x}' is not a {ctx.dtype} tensor")
    out_shape = op.output_shape(shape)  # the kernel's checks (kernel fits, size-1 dimensions)
    (kh, kw), (sh, sw), (dh, dw) = op.kernel_size, op.stride, op.dilations
    top, left, bottom, right = op.pad_amount
    em = Emitter(node, ctx)
    if any(op.pad_amount):
        pads = em.const([0, top, left, 0, 0, bottom, right, 0], "pads", np.int64)
        x = em.op("Pad", [x, pads, em.const(float(op.pad_value), "pad_value")], mode="constant")
    oh, ow = out_shape[1], out_shape[2]
    steps = em.const([sh, sw], "steps", np.int64)
    axes = em.const([1, 2], "axes", np.int64)
    slices = []
    for a in range(kh):
        for b in range(kw):
            starts = em.const([a * dh, b * dw], f"starts_{a}_{b}", np.int64)
            ends = em.const([a * dh + (oh - 1) * sh + 1, b * dw + (ow - 1) * sw + 1], f"ends_{a}_{b}", np.int64)
            slices.append(em.op("Slice", [x, starts, ends, axes, steps]))
    if len(slices) == 1:
        em.op("Identity", slices, output=node.output[0])
    else:
        em.op("Concat", slices, output=node.output[0], axis=3)
    return em.result


#: op_type → lowering function
LOWERINGS: dict[str, Callable[[onnx.NodeProto, Any, LoweringContext], Lowering]] = {
    "Quant": lower_quant,
    "IntQuant": lower_quant,
    "BipolarQuant": lower_bipolar_quant,
    "MultiThreshold": lower_multithreshold,
    "Trunc": lower_trunc,
    "Im2Col": lower_im2col,
}


def lower_node(node: onnx.NodeProto, op: CustomOp, ctx: LoweringContext) -> Lowering:
    """The exact standard-op lowering of custom ``node`` (whose op instance is ``op``); :class:`NotLowerable`
    when there is none in this context, :class:`~finnlite.core.errors.OpError` for constant parameters the op
    rejects."""
    fn = LOWERINGS.get(node.op_type)
    if fn is None:
        raise NotLowerable(f"no lowering for {node.op_type}")
    if ctx.opset < MIN_OPSET:
        raise NotLowerable(f"opset {ctx.opset} < {MIN_OPSET}")
    lowering = fn(node, op, ctx)
    for name, value in lowering.constants.items():
        if value.dtype.kind == "f" and value.dtype != ctx.dtype:
            raise NotLowerable(f"constant {name} would have dtype {value.dtype}, not {ctx.dtype}")
    return lowering
