"""Weight quantizers → integer initializers, with the scale moved into a Mul (FINN's ``FoldQuantWeights``).

A Quant or BipolarQuant whose inputs are all constants computes a constant ``W_q = (q − z)·s``. It is replaced by the
integer initializer ``W_int = q − z`` (float32 storage, annotated with the quantizer's exact datatype: INTb/UINTb,
BIPOLAR, BINARY, or the type of ``q − z`` for an integer zero-point z ≠ 0) and the scale goes into a Mul. Where the
Mul goes is the pass's ``scale_placement``:

* ``"after"`` (default, FINN's form): the Mul follows the consumer — ``MatMul(x, W_q) = MatMul(x, W_int)·s`` for a
  per-tensor or per-output-channel s, and likewise for Conv (grouped and depthwise included), ConvTranspose, Gather,
  Gemm and Mul consumers. This is exact in real arithmetic, and bit-exact in float32 only when every product and
  partial sum is exact (power-of-two scales on small integers, as in the BNN-PYNQ models): otherwise the
  consumer's float32 sums round differently (the relative difference is of the order of float32's epsilon, which
  can move a downstream quantizer across a tie). Biases (the quantizer feeds an Add/Sub, the bias input of a Gemm,
  Conv or ConvTranspose, or such a consumer through a Reshape/Unsqueeze/Squeeze/Flatten) cannot carry a scale
  past anything: they are folded into their float constant ``W_q`` (what the quantizer computes), annotated
  FLOAT32, together with the shape ops on the way to their Add (ConvBiasToAdd's Reshape), and the Add records the
  exact value ``(q − z)·s`` (:func:`streamline.exact.set_exact`), which float32 rounds and float64 execution of
  the original does not (Int32Bias: ``q`` up to 2^24, ``s = fl32(s_in·s_w)``). A quantizer none of these applies to (another consumer, a per-input-channel scale, a fractional
  zero-point, a graph output) is left in place and reported.
* ``"before"``: ``W_int → [Add(−z)] → Mul(s) →`` consumer, whatever the consumer: the Mul computes ``(q − z)·s`` in
  the kernel's order, so the model is bit-identical to the original. The streamlining stage then moves the Mul
  past the consumer (in exact arithmetic). Note that constant folding would undo this form (all inputs are
  constants), so run this placement only where nothing folds constants in between.

The integer values are recovered as ``q = round(W_q/s + z)`` and accepted only if ``(q − z)·s``, recomputed as the
kernel computes it, reproduces ``W_q`` bit for bit (up to the sign of zero) and q lies in the quantizer's range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import onnx_ir as ir

from custom_ops.bipolar_quant import bipolar_quant
from custom_ops.common import by_rows
from custom_ops.quant import max_int, min_int, quant
from custom_ops.registry import is_standard_domain
from finnlite.core.cleanup import fold_node
from streamline.exact import const_operand, set_exact
from streamline.real_thresholds import fractions_of
from finnlite.core.datatypes import BaseDataType, DataType, int_type, smallest_int_type
from finnlite.core.graphutil import add_constant, annotate, rank_of, take_over
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.convert_common import (FLOAT32, QUANT_OPS, Unsupported, append_binary, const_input, custom_op,
                                       drop_unused, is_custom, positive_scale, scalar_int)
from finnlite.core.policies import DEFAULT_POLICY, Equality

if TYPE_CHECKING:
    from finnlite.core.model import Model

ScalePlacement = Literal["after", "before"]
#: ops that only reshape a constant on its way to a bias input
_SHAPE_OPS = ("Reshape", "Unsqueeze", "Squeeze", "Flatten")
_BIAS_INPUT = {"Gemm": 2, "Conv": 2, "ConvTranspose": 2}


@dataclass
class IntegerWeight:
    """A weight quantizer's constant output ``W_q = (q − zeropoint)·scale`` split into its integers and parameters."""

    q: np.ndarray                 # float32, integer-valued, in the quantizer's range
    zeropoint: np.ndarray         # float32, broadcastable
    scale: np.ndarray             # float32, broadcastable, > 0
    output: np.ndarray | None     # the quantizer's output W_q (float32); None once split into q
    dtype: BaseDataType           # exact type of q
    qmin: int
    qmax: int

    @property
    def integer_zeropoint(self) -> bool:
        return bool(np.all(self.zeropoint == np.round(self.zeropoint)))

    def folded(self) -> tuple[np.ndarray, BaseDataType]:
        """``q − z`` (integer z) and its datatype: the quantizer's own type if z = 0, else the type of the shifted
        range (widened honestly, e.g. UINT4 with z = 8 gives INT4, with z = 3 INT5)."""
        if not np.any(self.zeropoint != 0):
            return self.q, self.dtype
        values = (self.q - self.zeropoint).astype(np.float32)
        z = self.zeropoint
        return values, smallest_int_type(self.qmin - int(z.max()), self.qmax - int(z.min()))


def _same_float32(a: np.ndarray, b: np.ndarray) -> bool:
    """``np.array_equal(float32_to_key(a), float32_to_key(b))`` (same bits, or both zeros of either sign) without
    the int64 keys, which take 12 times the weight's size."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and bool(np.all((a == b) | (a.view(np.int32) == b.view(np.int32))))


def quantizer_output(node: ir.Node) -> np.ndarray:
    """The constant output of weight quantizer ``node``, computed by its kernel; :class:`Unsupported` if a
    parameter is missing or invalid."""
    return integer_weight(node, split=False).output


def integer_weight(node: ir.Node, split: bool = True) -> IntegerWeight:
    """Split the constant output of weight quantizer ``node`` into integers and parameters (with ``split=False``
    only the output is computed, ``q`` is left empty; with ``split`` the output is not kept); :class:`Unsupported`
    if a parameter is missing or the split does not reproduce the kernel's output exactly (e.g. integers beyond
    float32's 2^24).

    The split runs over blocks of rows (:func:`custom_ops.common.by_rows`): the kernel is elementwise, so each block
    computes what the whole weight would, and the temporaries (the kernel's, a float64 copy, the check's) are those
    of a block, not five to six copies of the largest weight at once."""
    custom = custom_op(node)
    w = const_input(node, 0, "weight")
    scale = positive_scale(const_input(node, 1, "scale"))
    if node.op_type == "BipolarQuant":
        zeropt = np.zeros((), np.float32)
        kernel = lambda x, s, z: bipolar_quant(x, s)  # noqa: E731
        qmin, qmax, dtype = -1, 1, DataType["BIPOLAR"]
    else:
        zeropt = const_input(node, 2, "zero-point")
        bitwidth = const_input(node, 3, "bit width", float32=False)
        bits = scalar_int(bitwidth, "bit width")
        signed, narrow, mode = custom.signed, custom.narrow, custom.rounding_mode
        kernel = lambda x, s, z: quant(x, s, z, bitwidth, signed, narrow, mode)  # noqa: E731
        if bits == 1 and signed:
            qmin, qmax = -1, 1
        else:
            qmin, qmax = min_int(signed, narrow, bits), max_int(signed, narrow, bits)
        dtype = int_type(bits, signed)
    scale, zeropt = np.asarray(scale), np.asarray(zeropt)
    if not split:
        y = np.asarray(kernel(w, scale, zeropt), dtype=np.float32)
        return IntegerWeight(np.empty(0, np.float32), zeropt, scale, y, dtype, qmin, qmax)

    def split_block(x: np.ndarray, s: np.ndarray, z: np.ndarray) -> np.ndarray:
        y = np.asarray(kernel(x, s, z), dtype=np.float32)
        with np.errstate(all="ignore"):
            t = y.astype(np.float64)
            np.divide(t, s, out=t)
            np.add(t, z, out=t)
            q = np.round(t, out=t).astype(np.float32)
        ok = (q >= qmin) & (q <= qmax)
        if dtype == DataType["BIPOLAR"]:
            ok &= q != 0
        recomputed = np.asarray((q - z) * s, dtype=np.float32)
        if not (ok.all() and _same_float32(recomputed, y)):
            raise Unsupported("the quantized weights are not reproduced exactly by integers and the scale")
        return q

    q = by_rows(split_block, w, scale, zeropt, block=_BLOCK_ELEMENTS)
    return IntegerWeight(q, zeropt, scale, None, dtype, qmin, qmax)


#: elements per block of :func:`integer_weight` (256 KB of float32: the kernels make a few temporaries of a block)
_BLOCK_ELEMENTS = 1 << 16


# -- where a scale can go after a consumer ------------------------------------------------------------------------
@dataclass
class _After:
    """How to move the scale past one consumer: multiply the consumer's output by ``factor`` (a constant; with
    ``gather``, gathered by the consumer's indices first), after re-creating the consumer without its bias input
    (``drop_input``) when it has one, which is then added after the Mul (``bias``)."""

    consumer: ir.Node
    factor: np.ndarray
    gather: tuple[ir.Value, int] | None = None     # (indices, axis): factor = Gather(factor, indices, axis)
    bias: ir.Value | np.ndarray | None = None      # bias input moved into an Add after the Mul
    drop_input: int | None = None                  # index of the bias input to remove from the consumer


def _vary_axes(scale: np.ndarray, rank: int) -> set[int]:
    if scale.ndim > rank:
        raise Unsupported(f"the scale has more dimensions ({scale.ndim}) than the weight ({rank})")
    return {rank - scale.ndim + i for i, d in enumerate(scale.shape) if d != 1}


def _per_axis(scale: np.ndarray, rank: int, axis: int) -> np.ndarray:
    """The scale's values along ``axis`` of a rank-``rank`` weight, as a 1-D array."""
    full = scale.reshape((1,) * (rank - scale.ndim) + scale.shape)
    return np.moveaxis(full, axis, 0).reshape(full.shape[axis], -1)[:, 0].copy()


def _attr(node: ir.Node, name: str, default: Any) -> Any:
    a = node.attributes.get(name)
    return default if a is None else a.value


def _bias_const(model: "Model", v: ir.Value) -> np.ndarray:
    """The constant value of a bias input: a constant, or the output of a constant weight quantizer (computed)."""
    arr = const_array(v)
    if arr is not None:
        return arr
    p = v.producer()
    if p is not None and is_custom(p, *QUANT_OPS, "BipolarQuant") and const_array(p.inputs[0]) is not None:
        return quantizer_output(p)
    raise Unsupported("the consumer's bias input is not a constant")


def plan_after(model: "Model", consumer: ir.Node, index: int, shape: tuple[int, ...], scale: np.ndarray) -> _After:
    """The rewrite that moves ``scale`` (broadcast against a weight of ``shape`` read as input ``index`` of
    ``consumer``) past the consumer; :class:`Unsupported` when the scale does not commute with it."""
    op, rank = consumer.op_type, len(shape)
    axes = _vary_axes(scale, rank)
    per_tensor = not axes
    s_scalar = scale.reshape(-1)[:1].reshape(())
    if not is_standard_domain(consumer.domain):
        raise Unsupported(f"consumer {op} is not a standard op")
    if op == "MatMul":
        if rank < 2 and not per_tensor:
            raise Unsupported("a per-channel scale on a 1-D MatMul operand")
        if per_tensor:
            return _After(consumer, s_scalar)
        if index == 1 and axes == {rank - 1}:
            return _After(consumer, _per_axis(scale, rank, rank - 1))
        if index == 0 and axes == {rank - 2}:
            return _After(consumer, _per_axis(scale, rank, rank - 2)[:, None])
        raise Unsupported("the scale varies along a summed (or batch) axis of the MatMul")
    if op == "Gemm":
        if index != 1:
            raise Unsupported("a quantized Gemm input A")
        if float(_attr(consumer, "beta", 1.0)) != 1.0 and len(consumer.inputs) > 2 and consumer.inputs[2] is not None:
            raise Unsupported("a Gemm with beta != 1 and a bias")
        out_axis = 0 if int(_attr(consumer, "transB", 0)) else 1
        if not (per_tensor or axes == {out_axis}):
            raise Unsupported("the scale varies along the summed axis of the Gemm")
        factor = s_scalar if per_tensor else _per_axis(scale, rank, out_axis)
        bias = consumer.inputs[2] if len(consumer.inputs) > 2 else None
        return _After(consumer, factor, bias=bias, drop_input=2 if bias is not None else None)
    if op in ("Conv", "ConvTranspose"):
        if index != 1:
            raise Unsupported(f"a quantized {op} input {index}")
        group = int(_attr(consumer, "group", 1))
        if per_tensor:
            per_out = None
        elif op == "Conv" and axes == {0}:
            per_out = _per_axis(scale, rank, 0)
        elif op == "ConvTranspose" and axes == {1}:
            per_out = np.tile(_per_axis(scale, rank, 1), group)
        elif op == "ConvTranspose" and axes == {0} and shape[0] == group:
            per_out = np.repeat(_per_axis(scale, rank, 0), shape[1])
        else:
            raise Unsupported(f"the scale varies along a summed axis of the {op} weight")
        factor = s_scalar if per_out is None else per_out.reshape((1, -1) + (1,) * (rank - 2))
        bias = consumer.inputs[2] if len(consumer.inputs) > 2 else None
        bias_arr = None
        if bias is not None:
            bias_arr = _bias_const(model, bias).astype(np.float32).reshape((1, -1) + (1,) * (rank - 2))
        return _After(consumer, factor, bias=bias_arr, drop_input=2 if bias is not None else None)
    if op == "Gather":
        if index != 0:
            raise Unsupported("quantized Gather indices")
        axis = int(_attr(consumer, "axis", 0)) % rank
        if per_tensor:
            return _After(consumer, s_scalar)
        full = scale.reshape((1,) * (rank - scale.ndim) + scale.shape)
        indices = consumer.inputs[1]
        if axes == {axis}:
            return _After(consumer, full, gather=(indices, axis))
        idx_rank = rank_of(indices)
        if idx_rank is None:
            raise Unsupported("the rank of the Gather indices is unknown")
        return _After(consumer, full.reshape(full.shape[:axis] + (1,) * idx_rank + full.shape[axis + 1:]))
    if op == "Mul":
        return _After(consumer, scale.reshape((1,) * (rank - scale.ndim) + scale.shape) if not per_tensor
                      else s_scalar)
    raise Unsupported(f"cannot move a scale past a {op} consumer")


def is_bias_use(node: ir.Node, index: int, depth: int = 0) -> bool:
    """True if input ``index`` of ``node`` is added rather than multiplied: an Add/Sub operand or the bias input
    of a Gemm/Conv/ConvTranspose, possibly through shape-only ops (with constant shapes)."""
    if not is_standard_domain(node.domain):
        return False
    if node.op_type in ("Add", "Sub") or _BIAS_INPUT.get(node.op_type) == index:
        return True
    if node.op_type in _SHAPE_OPS and index == 0 and depth < 4:
        out = node.outputs[0]
        if out.is_graph_output() or not out.uses():
            return False
        if any(v is not None and const_array(v) is None for v in node.inputs[1:]):
            return False
        return all(is_bias_use(u.node, u.idx, depth + 1) for u in out.uses())
    return False


@dataclass(frozen=True, slots=True, eq=False)
class _WeightMatch:
    node: ir.Node
    weight: IntegerWeight
    mode: str                                  # "constant", "before" or "after"
    plans: list[_After] = field(default_factory=list)


@register_pass(group="convert")
class FoldQuantWeights(Rule):
    """Quant/BipolarQuant(W, s, z, b), all inputs constant  →  integer initializer q − z, and Mul(s) after the consumer.

    Pattern: a quantizer whose data input and parameters are constants. Conditions and algebra: see the module
    docstring; ``scale_placement`` "after" (FINN's form, exact in real arithmetic) or "before" (bit-exact in
    float32). With s = 1 and an integer zero-point no Mul is needed and both placements give the integer
    initializer alone. Consumers whose scale cannot move are reported (``misses``) and the quantizer stays.
    Gemm consumers are handled directly (the bias is split into an Add); with the tidy stage applied they are
    MatMul + Add already.
    """

    op_types = (*QUANT_OPS, "BipolarQuant")
    #: "after" reassociates float32 sums: rounding noise is tolerated (and one-step quantizer differences at
    #: near-ties downstream); "before" declares equality in ``__init__``
    verification = DEFAULT_POLICY

    def __init__(self, scale_placement: ScalePlacement = "after", max_rewrites: int | None = None) -> None:
        super().__init__(max_rewrites)
        if scale_placement not in ("after", "before"):
            raise ValueError(f"scale_placement must be 'after' or 'before', not {scale_placement!r}")
        self.scale_placement = scale_placement
        if scale_placement == "before":
            self.verification = Equality()

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_custom(node, *self.op_types) or node.inputs[0] is None or const_array(node.inputs[0]) is None:
            return None
        y = node.outputs[0]
        uses = list(y.uses())
        bias_only = bool(uses) and not y.is_graph_output() and all(is_bias_use(u.node, u.idx) for u in uses)
        try:
            if self.scale_placement == "after" and bias_only:
                return _WeightMatch(node, integer_weight(node, split=False), "constant")
            try:
                weight = integer_weight(node)
            except Unsupported:
                if not bias_only:
                    raise
                return _WeightMatch(node, integer_weight(node, split=False), "constant")
        except Unsupported as exc:
            return self.miss(node, str(exc))
        unity = bool(np.all(weight.scale == 1)) and weight.integer_zeropoint
        if unity:
            return _WeightMatch(node, weight, "unity")
        if self.scale_placement == "before":
            return _WeightMatch(node, weight, "before")
        if y.is_graph_output() or not uses:
            return self.miss(node, "the quantized weight is a graph output (or unused)")
        if not weight.integer_zeropoint:
            return self.miss(node, "a fractional zero-point cannot be folded into integer weights "
                                   "(scale_placement='before' converts it)")
        if len({id(u.node) for u in uses}) != len(uses):
            return self.miss(node, "a consumer reads the quantized weight twice")
        plans = []
        for u in uses:
            try:
                plans.append(plan_after(model, u.node, u.idx, weight.q.shape, weight.scale))
            except Unsupported as exc:
                return self.miss(node, f"consumer {u.node.name or u.node.op_type}: {exc}")
        return _WeightMatch(node, weight, "after", plans)

    def rewrite(self, model: "Model", m: _WeightMatch) -> None:
        node, w = m.node, m.weight
        y = node.outputs[0]
        base = node.name or y.name
        if m.mode == "constant":
            exact = _exact_output(node, w)
            init = add_constant(model, w.output, prefix=f"{base}_value", datatype=FLOAT32)
            take_over(model, y, init)
            _remove(model, node)
            _fold_into_bias_uses(model, init, exact)
            return
        if m.mode in ("unity", "after") or w.integer_zeropoint:
            values, dtype = w.folded()
            addend = None
        else:  # "before" with a fractional zero-point: q, then Add(−z)
            values, dtype, addend = w.q, w.dtype, np.negative(w.zeropoint)
        init = add_constant(model, values, prefix=f"{node.inputs[0].name}_int", datatype=dtype)
        if m.mode == "before":  # W_int → [Add(−z)] → Mul(s) in the quantizer's place, taking over its output
            chain: list[ir.Node] = []
            cur = init
            for op_type, param in (("Add", addend), ("Mul", None if np.all(w.scale == 1) else w.scale)):
                if param is None:
                    continue
                c = add_constant(model, np.asarray(param, dtype=np.float32), prefix=f"{base}_{op_type.lower()}",
                                 datatype=FLOAT32)
                out = model.make_value_like(y, prefix=f"{base}_{op_type.lower()}_out")
                chain.append(ir.Node("", op_type, [cur, c], outputs=[out], name=f"{base}_{op_type}"))
                cur = out
            model.graph.insert_after(node, chain)
            for n in chain:
                annotate(n.outputs[0], FLOAT32)
            take_over(model, y, cur)
            _remove(model, node)
            return
        take_over(model, y, init)
        _remove(model, node)
        for plan in m.plans:  # empty for "unity"
            _rewrite_after(model, plan, base)


def _exact_output(node: ir.Node, w: IntegerWeight) -> np.ndarray | None:
    """The bias quantizer's output ``(q − z)·s`` as exact Fractions — what float64 execution of the original adds
    (float32 rounds the product) —, or None where its integers are not recovered exactly (beyond 2^24)."""
    try:
        split = integer_weight(node)
    except Unsupported:
        return None
    q, z, s = np.broadcast_arrays(fractions_of(split.q), fractions_of(split.zeropoint), fractions_of(split.scale))
    if q.shape != w.output.shape:
        return None
    return (q - z) * s


def _fold_into_bias_uses(model: "Model", value: ir.Value, exact: np.ndarray | None) -> None:
    """Carry the folded bias ``value`` to its Adds as a constant: fold the shape-only ops (constant shapes) on the
    way — ConvBiasToAdd's Reshape to [1, C, 1, …] —, and record the exact value on each Add it reaches
    (:func:`streamline.exact.set_exact`), so that the scales and thresholds it meets are computed from it."""
    for use in list(value.uses()):
        node = use.node
        if node.op_type in _SHAPE_OPS and use.idx == 0:
            for new in fold_node(model, node):
                annotate(new, FLOAT32)
                shape = const_array(new).shape
                _fold_into_bias_uses(model, new, None if exact is None else exact.reshape(shape))
        elif node.op_type == "Add" and exact is not None and const_operand(node) is not None:
            set_exact(node, exact)


def _remove(model: "Model", node: ir.Node) -> None:
    inputs = list(node.inputs)
    model.remove_node(node)
    drop_unused(model, inputs)


def _rewrite_after(model: "Model", plan: _After, base: str) -> None:
    consumer = plan.consumer
    if plan.drop_input is not None:
        inputs = [v for i, v in enumerate(consumer.inputs) if i != plan.drop_input]
        old_out = consumer.outputs[0]
        new_out = model.make_value_like(old_out, prefix=f"{old_out.name}_nobias")
        replacement = ir.Node(consumer.domain, consumer.op_type, inputs, attributes=list(consumer.attributes.values()),
                              outputs=[new_out], name=consumer.name)
        model.graph.insert_after(consumer, replacement)
        take_over(model, old_out, new_out)
        annotate(new_out, FLOAT32)
        dropped = consumer.inputs[plan.drop_input]
        model.remove_node(consumer)
        if not isinstance(plan.bias, ir.Value):
            drop_unused(model, [dropped])
        consumer = replacement
    out = consumer.outputs[0]
    name = f"{consumer.name or base}_weight_scale"
    if plan.gather is not None:
        indices, axis = plan.gather
        table = add_constant(model, plan.factor.astype(np.float32), prefix=f"{name}_table", datatype=FLOAT32)
        factor = model.make_value(f"{name}_gathered", shape=None)
        g = ir.Node("", "Gather", [table, indices], attributes=[ir.AttrInt64("axis", axis)], outputs=[factor],
                    name=f"{name}_Gather")
        mul_out = model.make_value_like(out, prefix=f"{name}_out")
        take_over(model, out, mul_out)
        mul = ir.Node("", "Mul", [out, factor], outputs=[mul_out], name=name)
        model.graph.insert_after(consumer, [g, mul])
        annotate(factor, FLOAT32)
        annotate(mul_out, FLOAT32)
        last = mul
    else:
        last, _ = append_binary(model, out, "Mul", plan.factor, name=name)
    if plan.bias is not None:
        mul_out = last.outputs[0]
        if isinstance(plan.bias, np.ndarray):
            append_binary(model, mul_out, "Add", plan.bias, name=f"{consumer.name or base}_bias")
        else:
            add_out = model.make_value_like(mul_out, prefix=f"{consumer.name or base}_bias_out")
            take_over(model, mul_out, add_out)
            add = ir.Node("", "Add", [mul_out, plan.bias], outputs=[add_out], name=f"{consumer.name or base}_bias")
            model.graph.insert_after(last, add)
            annotate(add_out, FLOAT32)
