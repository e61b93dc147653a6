"""The reorder rules that read the op table (:mod:`streamline.algebra`) instead of naming op pairs.

* :class:`MoveLinearPastDataMovement` — a constant factor or summand passes any data-movement op: it is moved by
  the op's own element map;
* :class:`MoveMulPastLinear` — a constant factor passes a linear or selection op when it does not vary along the
  axes the op mixes (and is equal within each channel group of a convolution): the op's channel map carries it to
  the output;
* :class:`MoveAddPastAveraging` — a constant summand passes an average, a maximum (unchanged) or a sum (times the
  number of summed elements) when it does not vary along the reduced axes;
* :class:`MoveDataMovementPastElementwise` — a MultiThreshold or monotone function after a data-movement op goes
  before it, its per-channel thresholds mapped back through the element map (so that layout work gathers at the
  graph's outputs and thresholds meet the layer that produced their input).

Each replaces rules that named op pairs (FINN's names stay as aliases); each rewrite is exact (constants are moved
as exact rationals, :mod:`streamline.exact`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.multithreshold import channel_axis_of
from finnlite.core.graphutil import annotate, is_standard_domain, rank_of, reorder_channels
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.algebra import (MONOTONE, MOVEMENT, compress, data_inputs, element_map_of, mixing, movement,
                                static_shape, through_mixing, varying_axes)
from streamline.channel_gather import single_axis_gather
from streamline.convert_common import layout_for
from streamline.exact import LinearInput, linear_input, set_exact, to_float32
from streamline.real_thresholds import get_real_thresholds, set_real_thresholds

if TYPE_CHECKING:
    from finnlite.core.model import Model

#: plain reshapes: moving a threshold before them gains nothing (they stay where the flatten is)
_RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


@dataclass(frozen=True, slots=True, eq=False)
class MovementMatch:
    """A data-movement ``node`` whose data inputs are all made by Muls (or all by Adds) with constants (``lins``, in
    the order of the data inputs); ``moved``: the constant after each output; ``fill``: the new fill value, if the
    op has one that changes."""

    node: ir.Node
    lins: tuple[LinearInput, ...]
    moved: tuple[np.ndarray, ...]
    fill: Fraction | None = None


@dataclass(frozen=True, slots=True, eq=False)
class PastLinear:
    """A Mul/Add (``lin``) before input 0 of a linear or selection ``node``, and its constant after ``node``
    (``moved``)."""

    node: ir.Node
    lin: LinearInput
    moved: np.ndarray


@dataclass(frozen=True, slots=True, eq=False)
class ElementwiseAfterMovement:
    """An elementwise ``node`` (a MultiThreshold or a monotone function) reading data-movement ``movement``; for a
    MultiThreshold with several rows, the row for each channel of the movement's input along ``axis`` (``rows``)."""

    node: ir.Node
    movement: ir.Node
    rows: np.ndarray | None = None
    axis: int | None = None


def _append_const_op(model: "Model", node: ir.Node, output: int, op_type: str, exact: np.ndarray,
                     name: str) -> ir.Node:
    """Put ``op_type(y, c)`` after output ``output`` of ``node`` (its consumers read the result), ``c`` the float32
    rounding of the exact constant ``exact`` (recorded)."""
    y = node.outputs[output]
    out = model.make_value_like(y)
    model.replace_uses(y, out)
    exact = np.asarray(exact, dtype=object)
    if exact.size == 1:
        exact = np.asarray(exact.ravel()[0], dtype=object)
    k = model.add_initializer(to_float32(exact), prefix=f"{name}_c")
    new = ir.Node("", op_type, [y, k], outputs=[out], name=name)
    set_exact(new, exact)
    model.graph.insert_after(node, new)
    return new


def _unlink(model: "Model", node: ir.Node, index: int, lin: LinearInput) -> None:
    """Make input ``index`` of ``node`` read the computed input of ``lin`` and remove ``lin``."""
    node.replace_input_with(index, lin.data)
    model.remove_node(lin.node)


def _float32_exact(v: Fraction) -> bool:
    return Fraction(float(np.float32(float(v)))) == v


@register_pass(group="reorder")
class MoveLinearPastDataMovement(Rule):
    """op(Mul(x₁, c₁), …, Mul(xₙ, cₙ)) → Mul(op(x₁, …, xₙ), op(c₁, …, cₙ)) for a data-movement op (likewise Add),
    one Mul (Add) after each output.

    Algebra: each output element of a data-movement op is one input element (:mod:`streamline.algebra`), so moving
    the product ``x·c`` is the product of ``x`` moved and ``c`` moved by the same element map. At fill positions
    (Pad): a zero fill stays zero whatever the factor there; a fill ``v ≠ 0`` needs a scalar factor ``a`` and
    becomes ``v/a``, and an Add's scalar ``b`` turns it into ``v − b`` (exact in float32; FINN's rule that moved a
    Mul past a Pad with a non-zero fill changed the border). Conditions: every data input is such a Mul (Add) with a
    constant, feeding only this op; static shapes; the moved constant varies along no more axes than the original
    did (a scalar stays a scalar; a per-channel factor through a Transpose, a flatten or a Concat of channels stays
    one vector; one that a DepthToSpace would spread over space stays where it is). FINN: MoveScalarLinearPastInvariants
    (for Reshape, Flatten, Transpose, Squeeze, Unsqueeze), and the Concat and Pad cases."""

    op_types = tuple(MOVEMENT)
    aliases = ("MoveScalarLinearPastInvariants",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        decl = movement(node)
        if decl is None:
            return None
        data = data_inputs(node, decl)
        found = [linear_input(node, i, ("Mul", "Add")) for i in data]
        lins = tuple(x for x in found if x is not None)
        if not lins or len(lins) != len(found) or len({x.node.op_type for x in lins}) != 1:
            return None
        op = lins[0].node.op_type
        if node.op_type == "Gather" and const_array(node.inputs[1]) is None:
            return self.miss(node, "the Gather's indices are not constant")
        values = [x.exact() for x in lins]
        fill_value = None
        if decl.fill is not None:
            fill = node.inputs[decl.fill] if decl.fill < len(node.inputs) else None
            arr = const_array(fill) if fill is not None else np.zeros(())
            if arr is None:
                return self.miss(node, "the fill value is not a constant")
            mode = node.attributes.get("mode")
            fill_value = Fraction(float(np.asarray(arr).ravel()[0])) if arr.size else Fraction(0)
            if mode is not None and mode.value != "constant":
                fill_value = None  # reflect / edge: every output element is an input element
        same_scalar = all(v.size == 1 for v in values) and len({v.ravel()[0] for v in values}) == 1
        if same_scalar and fill_value is None and node.op_type != "Pad":
            scalar = np.asarray(values[0].ravel()[0], dtype=object)
            return MovementMatch(node, lins, (scalar,) * len(node.outputs))
        emap = element_map_of(model, node)
        if emap is None:
            return self.miss(node, f"the {node.op_type}'s shapes or parameters are not static")
        shapes = [static_shape(node.inputs[i]) for i in data]
        full = []
        for v, shape in zip(values, shapes):
            if v.ndim > len(shape):
                return self.miss(node, f"the {op}'s constant has a higher rank than its tensor")
            full.append(np.broadcast_to(v.reshape((1,) * (len(shape) - v.ndim) + v.shape), shape))
        new_fill = None
        if emap.has_fill and fill_value is not None:
            if all(v.size == 1 for v in values) and len({v.ravel()[0] for v in values}) == 1:
                a = values[0].ravel()[0]
                if op == "Mul" and fill_value != 0:
                    if a == 0:
                        return self.miss(node, "a zero factor cannot pass a non-zero fill")
                    new_fill = fill_value / a
                elif op == "Add":
                    new_fill = fill_value - a
                if new_fill is not None and not _float32_exact(new_fill):
                    return self.miss(node, "the moved fill value is not exact in float32")
                return MovementMatch(node, lins, (np.asarray(a, dtype=object),) * len(node.outputs), new_fill)
            if op == "Add" or fill_value != 0:
                return self.miss(node, f"a non-scalar {op} cannot pass a fill (the fill value is one scalar)")
        before = max((len(varying_axes(v)) for v in values), default=0)
        moved = []
        for k in range(len(node.outputs)):
            gathered = emap.gather(full, k, fill=Fraction(0))
            care = emap.sources[k] >= 0  # a zero fill times anything is zero
            out = compress(gathered, care)
            if out is None or len(varying_axes(out)) > max(1, before):
                return self.miss(node, f"the {op}'s constant would vary along more axes after the {node.op_type}")
            moved.append(out)
        return MovementMatch(node, lins, tuple(moved))

    def rewrite(self, model: "Model", match: MovementMatch) -> None:
        node = match.node
        decl = movement(node)
        op, name = match.lins[0].node.op_type, match.lins[0].node.name
        for i, lin in zip(data_inputs(node, decl), match.lins):
            _unlink(model, node, i, lin)
        if match.fill is not None:
            k = model.add_initializer(np.array(float(match.fill), np.float32), prefix=f"{node.name}_fill")
            while len(node.inputs) < 3:
                node.resize_inputs(len(node.inputs) + 1)
            node.replace_input_with(2, k)
        for k, value in enumerate(match.moved):
            _append_const_op(model, node, k, op, value, name if k == 0 else f"{name}_{k}")


#: the linear and selection ops (streamline.algebra.mixing)
_MIXING_OPS = ("Conv", "ConvTranspose", "MatMul", "MaxPool", "GlobalMaxPool", "AveragePool", "GlobalAveragePool",
               "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")


def _plain_linear_input(node: ir.Node) -> bool:
    """False for a Conv/ConvTranspose with a bias input (not linear in x: the tidy stage moves biases to Adds) or a
    pool whose Indices output is read."""
    if node.op_type in ("Conv", "ConvTranspose") and len(node.inputs) > 2 and node.inputs[2] is not None:
        return False
    return not (len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()))


@register_pass(group="reorder")
class MoveMulPastLinear(Rule):
    """L(Mul(x, a)) → Mul(L(x), a') for a linear or selection op L (Conv, ConvTranspose, MatMul with a constant
    weight, pools, reductions) and a constant a that does not vary along the axes L mixes.

    Algebra: L sums (averages, takes the maximum of) input elements along its mixed axes (:func:`streamline.algebra
    .mixing`); a factor equal over every element that meets in one output element comes out of the sum, and out of
    a maximum when it is ≥ 0; zero padding stays zero. The factor per output element follows the op's channel map
    (:func:`streamline.algebra.through_mixing`): a scalar stays a scalar; a per-channel factor passes a depthwise
    Conv (one channel per group), a grouped Conv when it is equal within each group, a pool or a reduction over other
    axes; a per-row factor passes a MatMul. Conditions: the Mul feeds only L; L has no bias input; for a selection,
    a ≥ 0 (a negative factor would turn a maximum into a minimum: :mod:`streamline.pool_sign` moves such signs into
    the weights). FINN: MoveScalarMulPastMatMul, MoveScalarMulPastConv, MoveMulPastDWConv, MoveMulPastMaxPool."""

    op_types = _MIXING_OPS
    aliases = ("MoveScalarMulPastMatMul", "MoveScalarMulPastConv", "MoveMulPastDWConv", "MoveMulPastMaxPool")

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = linear_input(node, 0, ("Mul",))
        if lin is None or not _plain_linear_input(node):
            return None
        mix = mixing(node)
        if mix is None:
            return self.miss(node, f"the {node.op_type}'s axes or weight shape are not known")
        out = through_mixing(mix, lin.exact())
        if isinstance(out, str):
            return self.miss(node, f"the Mul's constant {out}" + (
                " (a per-channel scale cannot pass integer weights)" if node.op_type in ("Conv", "MatMul") else ""))
        if mix.selection and any(v < 0 for v in out.ravel()):
            return self.miss(node, f"a negative scale cannot pass {node.op_type}")
        return PastLinear(node, lin, out)

    def rewrite(self, model: "Model", match: PastLinear) -> None:
        _unlink(model, match.node, 0, match.lin)
        _append_const_op(model, match.node, 0, "Mul", match.moved, match.lin.node.name)


@register_pass(group="reorder")
class MoveAddPastAveraging(Rule):
    """L(Add(x, b)) → Add(L(x), g·b) for an average, a maximum or minimum, or a sum L over axes along which the
    constant b does not vary (g = 1, or for a sum the number of summed elements).

    Algebra: an average of equal summands is the summand, the maximum of x + b is max(x) + b, a sum of n of them is
    n·b. Conditions: the Add feeds only L; no padding counts in an average (count_include_pad with pads would mix
    in zeros; a max pool's padding is −∞ and never chosen); the reduced axes' sizes are known. Weighted sums (Conv,
    MatMul) need the weights: MoveAddPastConv and MoveAddPastMatMul."""

    op_types = ("MaxPool", "GlobalMaxPool", "AveragePool", "GlobalAveragePool", "ReduceSum", "ReduceMean",
                "ReduceMax", "ReduceMin")

    def match(self, model: "Model", node: ir.Node) -> Any:
        lin = linear_input(node, 0, ("Add",))
        if lin is None or not _plain_linear_input(node):
            return None
        mix = mixing(node)
        if mix is None:
            return self.miss(node, f"the {node.op_type}'s axes are not known")
        if mix.gain is None:
            what = "an AveragePool that counts padding" if node.op_type == "AveragePool" else \
                f"{node.op_type} (unknown sizes)"
            return self.miss(node, f"an Add cannot pass {what}")
        out = through_mixing(mix, lin.exact())
        if isinstance(out, str):
            return self.miss(node, f"the Add's constant {out}")
        return PastLinear(node, lin, np.asarray(out * mix.gain, dtype=object) if mix.gain != 1 else out)

    def rewrite(self, model: "Model", match: PastLinear) -> None:
        _unlink(model, match.node, 0, match.lin)
        _append_const_op(model, match.node, 0, "Add", match.moved, match.lin.node.name)


def _threshold_rows_back(model: "Model", node: ir.Node, mt: ir.Node) -> tuple[np.ndarray, int] | str | None:
    """For MultiThreshold ``mt`` reading data-movement ``node``'s output: ``(rows, axis)`` such that thresholding
    ``node``'s input with row ``rows[c]`` for channel ``c`` along ``axis`` and moving the result gives ``mt``'s
    output; None for one row of thresholds (nothing to map); or why not."""
    x, y = node.inputs[0], node.outputs[0]
    t = const_array(mt.inputs[1])
    rank_in, rank_out = rank_of(x, constants=False), rank_of(y, constants=False)
    if t is None or rank_in is None or rank_out is None:
        return "the thresholds or ranks are not known"
    if t.shape[0] == 1:
        return None
    emap = element_map_of(model, node)
    if emap is None:
        return "the data movement's shapes are not static"
    layout = mt.attributes["data_layout"].value if "data_layout" in mt.attributes else ""
    out_axis = channel_axis_of(layout, rank_out)
    out_shape, in_shape = static_shape(y), static_shape(x)
    row_of_out = np.broadcast_to(np.arange(out_shape[out_axis]).reshape(
        [-1 if a == out_axis else 1 for a in range(rank_out)]), out_shape).ravel()
    src = emap.sources[0].ravel()
    read = src >= 0
    rows = np.full(int(np.prod(in_shape)), -1, dtype=np.int64)
    rows[src[read]] = row_of_out[read]
    if not np.array_equal(rows[src[read]], row_of_out[read]):
        return "output elements of different channels read the same input element"
    rows = rows.reshape(in_shape)
    for axis in range(rank_in):
        along = np.moveaxis(rows, axis, 0).reshape(in_shape[axis], -1)
        cared = along >= 0
        first = np.take_along_axis(along, np.argmax(cared, axis=1)[:, None], 1)[:, 0]
        if np.all((along == first[:, None]) | ~cared):
            return first.clip(min=0), axis
    return "a channel of the thresholds is spread over several input axes"


def _channel_permutation(model: "Model", d: ir.Node) -> np.ndarray | None:
    """The indices π if data-movement ``d`` only reorders the channels (axis 1): output channel c is input channel
    π[c]."""
    shape = static_shape(d.inputs[0])
    if shape is None or len(shape) < 2 or static_shape(d.outputs[0]) != shape:
        return None
    emap = element_map_of(model, d)
    found = single_axis_gather(emap.sources[0], shape) if emap is not None else None
    if found is None or found[0] != 1 or not np.array_equal(np.sort(found[1]), np.arange(shape[1])):
        return None
    return found[1]


@register_pass(group="reorder")
class MoveDataMovementPastElementwise(Rule):
    """f(D(x)) → D(f'(x)) for a data-movement op D that is not a plain reshape (Transpose, DepthToSpace, Gather,
    Resize, ...) and f a MultiThreshold or an elementwise monotone function without parameters.

    Algebra: an elementwise f commutes with moving elements; a MultiThreshold's thresholds are chosen by channel, so
    thresholding x with row ``r(c)`` for x's channel c, then moving, equals moving, then thresholding, when every
    output element of channel c' reads an input element of a channel c with ``r(c) = c'`` (the rows are mapped back
    through D's element map; one row for all channels needs nothing). Fill positions would need ``f(fill) = fill``,
    which a MultiThreshold (it counts) does not give: D has no fill here. Conditions: D has one data input and one
    output, read only by f; the thresholds' channels come from one axis of x; D does not read a graph input (the
    input's own layout change stays first). FINN's AbsorbTransposeIntoMultiThreshold is the case D = Transpose, after
    lowering (:mod:`streamline.layout`)."""

    op_types = ("MultiThreshold",) + tuple(sorted(MONOTONE))

    def match(self, model: "Model", node: ir.Node) -> Any:
        if node.op_type == "MultiThreshold":
            if is_standard_domain(node.domain):
                return None
        elif not is_standard_domain(node.domain) or len(node.inputs) != 1:
            return None
        x = node.inputs[0]
        d = x.producer() if x is not None else None
        if d is None or d.op_type in _RESHAPES or len(d.outputs) != 1 or len(node.outputs) != 1:
            return None
        decl = movement(d)
        if decl is None or len(data_inputs(d, decl)) != 1 or decl.fill is not None:
            return None
        if len(x.uses()) != 1 or x.is_graph_output() or static_shape(d.inputs[0]) is None or \
                d.inputs[0].is_graph_input():
            return None  # (the input's own layout change stays at the input)
        if node.op_type != "MultiThreshold":
            return ElementwiseAfterMovement(node, d)
        rows = _threshold_rows_back(model, d, node)
        if isinstance(rows, str):
            return self.miss(node, f"cannot go before the {d.op_type}: {rows}")
        return ElementwiseAfterMovement(node, d, *rows) if rows is not None else ElementwiseAfterMovement(node, d)

    def rewrite(self, model: "Model", match: ElementwiseAfterMovement) -> None:
        node, d, rows = match.node, match.movement, match.rows
        x, y = d.inputs[0], node.outputs[0]
        inputs = [x] + list(node.inputs[1:])
        attrs = [a for k, a in node.attributes.items() if k != "data_layout"]
        rank = rank_of(x, constants=False)
        if rows is not None:
            t = const_array(node.inputs[1])
            inputs[1] = model.add_initializer(np.ascontiguousarray(t[rows]), prefix=f"{node.name}_thr")
            attrs.append(ir.AttrString("data_layout", layout_for(match.axis, rank)))
        elif "data_layout" in node.attributes and len(node.attributes["data_layout"].value) == rank:
            attrs.append(node.attributes["data_layout"])
        f_out = model.make_value_like(x)
        new_f = ir.Node(node.domain, node.op_type, inputs, attributes=attrs, outputs=[f_out], name=node.name)
        new_f.metadata_props.update(node.metadata_props)
        if rows is not None:
            rt = get_real_thresholds(node)
            if rt is not None and rt.shape[0] > 1:
                set_real_thresholds(new_f, rt.rows(rows))
        d_out = model.make_value_like(y)
        new_d = ir.Node(d.domain, d.op_type, [f_out] + list(d.inputs[1:]), attributes=list(d.attributes.values()),
                        outputs=[d_out], name=d.name)
        if model.has_tensor_datatype(y.name):
            dt = model.get_tensor_datatype(y.name)
            annotate(f_out, dt)
            annotate(d_out, dt)
        shuffle = _channel_permutation(model, d)
        if shuffle is not None:  # the thresholds now see the channels in another order: the final check maps them
            reorder_channels(new_f, np.argsort(shuffle))
        model.graph.insert_before(d, [new_f, new_d])
        model.replace_uses(y, d_out)
        model.remove_node(node)
        model.remove_node(d)
