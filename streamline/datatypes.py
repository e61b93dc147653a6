"""Range-based datatype inference: which tensors are integers, and in which range.

One pass over the graph in topological order computes, per tensor, a value range ``[lo, hi]`` and whether every
value is an integer, from the graph inputs' annotations, the initializers' values and each op's arithmetic:

* MultiThreshold: ``out_bias + out_scale · [0, N]``; custom ops otherwise by their own datatype inference;
* MatMul / Conv with a constant integer weight: per output channel, the positive weights times the input's upper
  bound plus the negative weights times its lower bound (and the other way round), with zero included for padded
  convolutions; Gemm likewise; ConvTranspose as a padded convolution over every weight of an output channel (an
  output element sums a subset of them);
* Add / Sub / Mul / Neg with integer operands; ReduceSum (N times the input's range); data movement (Reshape, Transpose, MaxPool, Im2Col, Concat, ...)
  keeps the range; Relu clips it.

Integer tensors are annotated with the narrowest INTn/UINTn (BIPOLAR/BINARY where the values are exactly those),
and every other node output with FLOAT32, so annotations never claim more than is true. :class:`InferDataTypes`
also narrows integer-annotated weights to their values and sets MultiThreshold ``out_dtype`` from the levels: the
annotations FINN sizes hardware from are the tightest that hold.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from finnlite.core.datatypes import BaseDataType, DataType, is_integer_type, tightest_datatype
from finnlite.core.graphutil import zero_padded
from finnlite.core.passes import Transformation, register_pass
from finnlite.core.ranges import WeightSums, accumulator_range, weight_sums
from finnlite.core.shapes import const_array
from finnlite.core.tensors import element_values

#: ops whose output holds only values of their (first) input
_MOVE_OPS = {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool", "MaxPoolNHWC", "Identity",
             "Slice", "Gather", "Im2Col", "Expand", "Tile", "Split", "SpaceToDepth", "DepthToSpace", "Resize",
             "GlobalMaxPool", "ReduceMax", "ReduceMin", "Pad"}


@dataclass(frozen=True)
class Range:
    """A value range and whether all values are integers. ``bipolar`` marks values in {-1, +1} only."""

    lo: float
    hi: float
    integer: bool
    bipolar: bool = False

    @staticmethod
    def unknown() -> "Range":
        return Range(-np.inf, np.inf, False)

    @staticmethod
    def of_array(arr: np.ndarray) -> "Range":
        arr = np.asarray(arr)
        if arr.size == 0 or not np.issubdtype(arr.dtype, np.number):
            return Range.unknown()
        if np.issubdtype(arr.dtype, np.integer):
            integer = True
        else:
            finite = np.isfinite(arr)
            integer = bool(finite.all() and np.array_equal(arr, np.round(arr)))
        lo, hi = float(np.min(arr)), float(np.max(arr))
        bipolar = integer and lo == -1 and hi == 1 and not np.any(arr == 0)
        return Range(lo, hi, integer, bipolar)

    @staticmethod
    def of_datatype(dt: BaseDataType) -> "Range":
        if not is_integer_type(dt):
            return Range.unknown()
        return Range(float(dt.min()), float(dt.max()), True, dt.name == "BIPOLAR")

    def datatype(self) -> BaseDataType:
        """The narrowest datatype holding this range (FLOAT32 when it is not an integer range)."""
        if not self.integer or not np.isfinite(self.lo) or not np.isfinite(self.hi):
            return DataType["FLOAT32"]
        return tightest_datatype(self.lo, self.hi, has_zero=not self.bipolar)


def _matmul_range(x: Range, sums: WeightSums | None, with_zero: bool) -> Range:
    """Range of a matrix product of inputs in ``x`` with a constant weight given by its :func:`weight_sums`
    (:func:`finnlite.core.ranges.accumulator_range`); zero joins the input range for a padded convolution."""
    if sums is None:
        return Range.unknown()
    lo_x, hi_x = (min(x.lo, 0.0), max(x.hi, 0.0)) if with_zero else (x.lo, x.hi)
    lo, hi = accumulator_range(lo_x, hi_x, sums)
    return Range(lo, hi, x.integer and sums[2])


def _node_range(node: ir.Node, ins: list[Range], consts: list[np.ndarray | None]) -> Range:
    op = node.op_type
    attrs = {k: a.value for k, a in node.attributes.items()}
    if op in _MOVE_OPS:
        r = ins[0]
        if op == "Pad" and len(consts) > 2 and consts[2] is not None:
            v = float(np.asarray(consts[2]).ravel()[0])
            return Range(min(r.lo, v), max(r.hi, v), r.integer and v == int(v))
        if op == "Pad" or (op == "Im2Col" and any(attrs.get("pad_amount", []))):
            v = float(attrs.get("pad_value", 0)) if op == "Im2Col" else 0.0
            return Range(min(r.lo, v), max(r.hi, v), r.integer and v == int(v))
        return r
    if op == "Concat":
        return Range(min(r.lo for r in ins), max(r.hi for r in ins), all(r.integer for r in ins),
                     all(r.bipolar for r in ins))
    if op == "Relu":
        r = ins[0]
        return Range(max(r.lo, 0.0), max(r.hi, 0.0), r.integer)
    if op == "Neg":
        r = ins[0]
        return Range(-r.hi, -r.lo, r.integer, r.bipolar)
    if op in ("Add", "Sub"):
        a, b = ins[0], ins[1]
        if op == "Sub":
            b = Range(-b.hi, -b.lo, b.integer)
        return Range(a.lo + b.lo, a.hi + b.hi, a.integer and b.integer)
    if op == "Mul":
        a, b = ins[0], ins[1]
        prods = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
        if any(np.isnan(p) for p in prods):
            return Range.unknown()
        return Range(min(prods), max(prods), a.integer and b.integer, a.bipolar and b.bipolar)
    if op == "MatMul" and consts[1] is not None and consts[1].ndim == 2:
        return _matmul_range(ins[0], weight_sums(consts[1], "MatMul"), with_zero=False)
    if op == "Conv" and consts[1] is not None:
        return _matmul_range(ins[0], weight_sums(consts[1], "Conv"), with_zero=zero_padded(node))
    if op == "ConvTranspose" and consts[1] is not None:
        return _matmul_range(ins[0], _transposed_weight_sums(consts[1], int(attrs.get("group", 1))), with_zero=True)
    if op == "MultiThreshold":
        n = consts[1].shape[-1] if consts[1] is not None else None
        scale, bias = float(attrs.get("out_scale", 1.0)), float(attrs.get("out_bias", 0.0))
        if n is None:
            return Range.unknown()
        lo, hi = sorted((bias, bias + scale * n))
        integer = scale == int(scale) and bias == int(bias)
        bipolar = integer and n == 1 and {lo, hi} == {-1.0, 1.0}
        return Range(lo, hi, integer, bipolar)
    if op == "ReduceSum":  # a sum of N values of the input's range
        from streamline.reduce import reduce_axes

        axes, shape = reduce_axes(node), node.inputs[0].shape
        dims = [shape[a] for a in axes] if axes is not None and shape is not None else [None]
        if not all(isinstance(d, int) for d in dims):
            return Range.unknown()
        n = int(np.prod(dims))
        r = ins[0]
        return Range(r.lo * n, r.hi * n, r.integer)
    if op == "XnorPopcountMatMul":
        k = consts[1].shape[0] if consts[1] is not None else None
        return Range(0.0, float(k), True) if k is not None else Range(0.0, np.inf, True)
    return Range.unknown()


def _transposed_weight_sums(w: np.ndarray, group: int) -> WeightSums | None:
    """:data:`WeightSums` of a ConvTranspose weight ``[Cin, Cout/g, k...]`` by output channel: output channel
    ``j`` of group ``g`` sums inputs of that group with weights ``w[g·Cin/g:(g+1)·Cin/g, j]``."""
    w = np.asarray(w)
    cin, cout_g = w.shape[:2]
    if cin % group:
        return None
    blocks = w.reshape((group, cin // group, cout_g) + w.shape[2:])
    cols = np.moveaxis(blocks, 2, 1).reshape(group * cout_g, -1)
    return weight_sums(cols, "Conv")


def _custom_range(node: ir.Node, model: Any, ins: list[Range]) -> Range | None:
    """Range from a custom op's own datatype inference (Quant with scale 1, QuantAvgPool2d, ...)."""
    from custom_ops.registry import is_custom_domain, make_op

    if not is_custom_domain(node.domain) or node.op_type in ("MultiThreshold", "XnorPopcountMatMul"):
        return None
    consts = [const_array(v) for v in node.inputs]
    try:
        dts = make_op(node).infer_datatypes([r.datatype() for r in ins], consts)
    except Exception:  # an op that cannot say leaves its output unknown
        return Range.unknown()
    return Range.of_datatype(dts[0])


class _ConstCache:
    """Ranges of constant tensors and weight-derived ranges, keyed by the tensor object (so a rewritten
    initializer, which is a new tensor, is recomputed); kept on the model between runs. The tensors are held
    weakly: a weight a pass replaces is freed then, not at the next run."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, Any], tuple[Any, Any]] = {}
        self.used: set[tuple[int, Any]] = set()

    def get(self, tensor: Any, key: Any, compute: Any) -> Any:
        k = (id(tensor), key)
        self.used.add(k)
        hit = self.entries.get(k)
        if hit is not None and hit[0]() is tensor:
            return hit[1]
        value = compute()
        try:
            ref: Any = weakref.ref(tensor)
        except TypeError:  # a tensor type without weak references: held (the id must not be reused meanwhile)
            ref = lambda t=tensor: t  # noqa: E731
        self.entries[k] = (ref, value)
        return value

    def prune(self) -> None:
        self.entries = {k: v for k, v in self.entries.items() if k in self.used}
        self.used = set()


def _cache(model: Any) -> _ConstCache:
    cache = getattr(model, "_finnlite_range_cache", None)
    if cache is None:
        cache = _ConstCache()
        setattr(model, "_finnlite_range_cache", cache)
    return cache


def _weight_tensor(node: ir.Node) -> Any:
    v = node.inputs[1] if len(node.inputs) > 1 else None
    return v.const_value if v is not None else None


def infer_ranges(model: Any) -> dict[str, Range]:
    """The range of every tensor of ``model`` (see the module docstring); the graph must be sorted. Ranges of
    constants and of weight sums are cached on the model across calls, keyed by the tensor objects."""
    cache = _cache(model)
    ranges: dict[str, Range] = {}
    for v in model.graph.inputs:
        ranges[v.name] = Range.of_datatype(model.get_tensor_datatype(v.name))
    for name, v in model.graph.initializers.items():
        t = v.const_value
        ranges[name] = cache.get(t, "range", lambda t=t: Range.of_array(element_values(t))) if t is not None \
            else Range.unknown()
    for node in model.graph:
        ins = []
        for v in node.inputs:
            if v is None:
                ins.append(Range.unknown())
            elif v.name in ranges:
                ins.append(ranges[v.name])
            else:
                c = const_array(v)
                ins.append(Range.of_array(c) if c is not None else Range.unknown())
        r = _custom_range(node, model, ins)
        if r is None:
            w = _weight_tensor(node) if node.op_type in ("MatMul", "Conv") else None
            if w is not None and node.op_type == "MatMul" and len(w.shape) == 2:
                sums = cache.get(w, "sums0", lambda w=w: weight_sums(w, "MatMul"))
                r = _matmul_range(ins[0], sums, with_zero=False)
            elif w is not None and node.op_type == "Conv":
                sums = cache.get(w, "sums_conv", lambda w=w: weight_sums(w, "Conv"))
                r = _matmul_range(ins[0], sums, with_zero=zero_padded(node))
            else:
                r = _node_range(node, ins, [const_array(v) if v is not None else None for v in node.inputs]) \
                    if ins else Range.unknown()
        for out in node.outputs:
            ranges[out.name] = r
    cache.prune()
    return ranges


@register_pass(group="tidy")
class InferDataTypes(Transformation):
    """Annotate every node output with the datatype its value range implies (module docstring); set each
    MultiThreshold's ``out_dtype`` to the datatype of its levels where they are integers (qonnx then annotates the
    output with ``out_dtype``, and FINN sizes the layer's output from it); and narrow every integer-annotated
    initializer other than thresholds to the tightest datatype of its values (FINN's MinimizeWeightBitWidth, done
    before FINN: a weight quantizer's bit width is an upper bound, e.g. 8-bit weights that are all in [-3, 3] are
    INT3, all ±1 BIPOLAR, all in [0, 3] UINT2). Thresholds keep the union with their input's datatype that
    :class:`~streamline.round_thresholds.RoundAndClipThresholds` gives them (FINN compares the input in the
    thresholds' type).

    Changes annotations only; returns False so that it never keeps a fixpoint loop alive."""

    def apply(self, model: Any) -> bool:
        model.topological_sort()
        ranges = infer_ranges(model)
        thresholds = set()
        for node in model.graph:
            for out in node.outputs:
                r = ranges.get(out.name)
                if r is None:
                    continue
                model.set_tensor_datatype(out.name, r.datatype())
            if node.op_type == "MultiThreshold" and len(node.inputs) > 1 and node.inputs[1] is not None:
                thresholds.add(node.inputs[1].name)
                levels = ranges.get(node.outputs[0].name) if node.outputs else None
                if "out_dtype" in node.attributes and levels is not None and is_integer_type(levels.datatype()):
                    name = levels.datatype().name
                    if node.attributes["out_dtype"].value != name:
                        node.attributes["out_dtype"] = ir.AttrString("out_dtype", name)
        for name in model.graph.initializers:
            r = ranges.get(name)
            if name in thresholds or r is None or not model.has_tensor_datatype(name):
                continue
            dt, tight = model.get_tensor_datatype(name), r.datatype()
            if is_integer_type(dt) and is_integer_type(tight) and dt != tight:
                model.set_tensor_datatype(name, tight)
        return False
