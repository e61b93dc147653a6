"""The absorb rules: constants and monotone ops in front of a MultiThreshold become part of its thresholds.

Thresholds are kept as exact real thresholds (:mod:`streamline.real_thresholds`) and materialized after every
change (:func:`materialize`): as integers (⌈R⌉, or ⌊R⌋ + 1 where strict) when the MultiThreshold's input is
annotated with an integer datatype, clipped to that datatype's range, and as the least float32 values otherwise.
A MultiThreshold that has no real thresholds yet (made by hand, or by an older converter) takes its float32
thresholds as exact: ``x ≥ T`` is what it computes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.multithreshold import channel_axis_of
from finnlite.core.datatypes import is_integer_type
from finnlite.core.graphutil import sole_producer
from finnlite.core.passes import Miss, Rule, Transformation, register_pass
from finnlite.core.shapes import const_array
from streamline.convert_common import layout_for
from streamline.exact import channel_vector, const_operand, exact_value, set_exact, shaped_for_axis, to_float32
from streamline.real_thresholds import (RealThresholds, ThresholdPrecisionError, get_real_thresholds, relu_composed,
                                        set_real_thresholds)

if TYPE_CHECKING:
    from finnlite.core.model import Model

log = logging.getLogger(__name__)


def mt_channel_axis(node: ir.Node) -> int:
    """The channel axis of a MultiThreshold node (from its data_layout and its input's rank)."""
    layout = node.attributes["data_layout"].value if "data_layout" in node.attributes else ""
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else 4
    return channel_axis_of(layout, rank)


def real_thresholds_of(model: Any, node: ir.Node) -> RealThresholds:
    """The node's real thresholds, or its float32 thresholds taken as exact (non-strict)."""
    rt = get_real_thresholds(node)
    if rt is not None:
        return rt
    t = const_array(node.inputs[1])
    return RealThresholds(t.astype(np.float64), np.zeros(t.shape, dtype=bool))


def materialize(model: Any, node: ir.Node) -> bool:
    """Write the float32 thresholds implied by the node's real thresholds and its input's datatype; True if they
    changed. An integer input whose exact thresholds float32 cannot hold (:class:`ThresholdPrecisionError`; the
    absorbing rules decline before making one, :func:`threshold_miss`) keeps the float32 form, the least float32 not
    below each real threshold: exact for every float32 input, and so for every integer the model's float32
    tensors hold; :class:`~streamline.round_thresholds.RoundAndClipThresholds` then declines to make them integers."""
    rt = get_real_thresholds(node)
    if rt is None:
        return False
    dt = model.get_tensor_datatype(node.inputs[0].name)
    new = None
    if is_integer_type(dt):
        try:
            new = rt.integer_thresholds(float(dt.min()), float(dt.max()))
        except ThresholdPrecisionError as exc:
            log.warning("MultiThreshold '%s': %s; its thresholds stay float32 numbers", node.name, exc)
    if new is None:
        new = rt.float_thresholds()
    old = const_array(node.inputs[1])
    if old is not None and old.shape == new.shape and np.array_equal(old, new):
        return False
    node.replace_input_with(1, model.add_initializer(new, prefix=f"{node.name}_thr"))
    return True


def threshold_miss(rule: Rule, model: Any, node: ir.Node, rt: RealThresholds, x: ir.Value) -> Miss | None:
    """A :class:`Miss` of ``rule`` at MultiThreshold ``node`` if the thresholds ``rt`` on its new input ``x`` (of an
    integer datatype) would need integers float32 cannot hold (accumulators beyond 2^24): rounding one would move
    a threshold, and FINN stores thresholds as float32. None if they fit, or if ``x`` is not an integer tensor."""
    dt = model.get_tensor_datatype(x.name)
    if not is_integer_type(dt):
        return None
    try:
        rt.integer_thresholds(float(dt.min()), float(dt.max()))
    except ThresholdPrecisionError as exc:
        return rule.miss(node, f"the thresholds on '{x.name}' ({dt.name}) would not be exact: {exc}")
    return None


def store_thresholds(model: Any, node: ir.Node, rt: RealThresholds) -> None:
    """Give MultiThreshold ``node`` the real thresholds ``rt`` and write them into its threshold input."""
    set_real_thresholds(node, rt)
    materialize(model, node)


def absorb_channel_vector(model: Any, node: ir.Node, value: np.ndarray) -> tuple[int, np.ndarray | None]:
    """``(axis, vec)``: the constant ``value`` in front of MultiThreshold ``node`` as a per-channel vector along the
    node's channel axis. A MultiThreshold with one row of thresholds and no ``data_layout`` has no channel axis of
    its own (its rank decides only the default, e.g. NWC for rank 3, where the exporter's Conv1d output is NCW):
    it takes the axis the constant varies along, which :func:`set_channel_axis` then records. ``vec`` is None if
    the constant varies along more than one axis (or along another axis of a per-channel node)."""
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
    if rank is None:
        return 0, None
    axis = mt_channel_axis(node)
    vec = channel_vector(value, rank, axis)
    if vec is None and "data_layout" not in node.attributes and real_thresholds_of(model, node).shape[0] == 1:
        for a in range(1, rank):
            vec = channel_vector(value, rank, a)
            if vec is not None:
                return a, vec
    return axis, vec


def set_channel_axis(node: ir.Node, axis: int) -> None:
    """Record ``axis`` as the channel axis of MultiThreshold ``node`` (its ``data_layout``), if it is not already."""
    if axis != mt_channel_axis(node):
        node.attributes["data_layout"] = ir.AttrString("data_layout", layout_for(axis, len(node.inputs[0].shape)))


@register_pass(group="absorb")
class AbsorbReluIntoMultiThreshold(Rule):
    """MultiThreshold(Relu(x)) → MultiThreshold'(x).

    Algebra: a threshold R > 0 (or R = 0, strict) sees Relu(x) ≥ R ⇔ x ≥ R; one that 0 already passes is passed by
    every x. Condition: the Relu feeds only the MultiThreshold."""

    op_types = ("MultiThreshold",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        return sole_producer(node, 0, ("Relu",)) and (node, node.inputs[0].producer())

    def rewrite(self, model: "Model", match: Any) -> None:
        node, relu = match
        rt = relu_composed(real_thresholds_of(model, node))
        node.replace_input_with(0, relu.inputs[0])
        model.remove_node(relu)
        store_thresholds(model, node, rt)


@dataclass(frozen=True, slots=True, eq=False)
class LinearIntoThresholds:
    """A match of AbsorbAdd/MulIntoMultiThreshold: ``node`` (the MultiThreshold) reads ``lin`` (the Add/Mul), whose
    input ``const_index`` is the constant; ``vec`` its exact values along the MultiThreshold's channel ``axis``."""

    node: ir.Node
    lin: ir.Node
    const_index: int
    vec: np.ndarray
    axis: int
    #: the MultiThreshold's real thresholds with the constant absorbed (worked out by the match's conditions)
    rt: RealThresholds | None = None


@register_pass(group="absorb")
class AbsorbAddIntoMultiThreshold(Rule):
    """MultiThreshold(Add(x, b)) → MultiThreshold(x) with thresholds R − b.

    Holds because x + b ≥ R ⇔ x ≥ R − b, per channel. Conditions: b is a constant that is a scalar or varies only
    along the MultiThreshold's channel axis (a per-tensor MultiThreshold without a data_layout takes b's axis,
    :func:`absorb_channel_vector`); the Add feeds only the MultiThreshold; on an integer x, every threshold ⌈R − b⌉
    is a float32 number (:func:`threshold_miss`: an accumulator range beyond 2^24 can need one that is not)."""

    op_types = ("MultiThreshold",)

    def match(self, model: "Model", node: ir.Node) -> LinearIntoThresholds | Miss | None:
        add = sole_producer(node, 0, ("Add",))
        if add is None:
            return None
        c = const_operand(add)
        if c is None:
            return self.miss(node, "the Add before it has no constant operand")
        axis, vec = absorb_channel_vector(model, node, exact_value(add, c[1]))
        if vec is None:
            return self.miss(node, "the Add's constant varies along a non-channel axis")
        rt = real_thresholds_of(model, node).shifted(vec)
        miss = threshold_miss(self, model, node, rt, add.inputs[1 - c[0]])
        return miss or LinearIntoThresholds(node, add, c[0], vec, axis, rt)

    def rewrite(self, model: "Model", match: LinearIntoThresholds) -> None:
        node, add, vec = match.node, match.lin, match.vec
        set_channel_axis(node, match.axis)
        rt = match.rt if match.rt is not None else real_thresholds_of(model, node).shifted(vec)
        node.replace_input_with(0, add.inputs[1 - match.const_index])
        model.remove_node(add)
        store_thresholds(model, node, rt)


@register_pass(group="absorb")
class AbsorbMulIntoMultiThreshold(Rule):
    """MultiThreshold(Mul(x, a)) → MultiThreshold(x) with thresholds R / a.

    Algebra: for a > 0, a·x ≥ R ⇔ x ≥ R/a. For a scalar a < 0, a·x ≥ R ⇔ x ≤ R/a: the thresholds are negated and
    counted from above (out_scale → −out_scale, out_bias → out_bias + out_scale·N, strictness flipped). For a = 0
    every threshold is constantly passed or not. Conditions: a is a scalar or varies only along the channel axis
    (a per-tensor MultiThreshold without a data_layout takes a's axis, :func:`absorb_channel_vector`);
    per-channel factors of mixed sign are left for AbsorbSignIntoWeights; the Mul feeds only the MultiThreshold; on
    an integer x, every threshold ⌈R/a⌉ is a float32 number (:func:`threshold_miss`)."""

    op_types = ("MultiThreshold",)

    def match(self, model: "Model", node: ir.Node) -> LinearIntoThresholds | Miss | None:
        mul = sole_producer(node, 0, ("Mul",))
        if mul is None:
            return None
        c = const_operand(mul)
        if c is None:
            return self.miss(node, "the Mul before it has no constant operand")
        axis, vec = absorb_channel_vector(model, node, exact_value(mul, c[1]))
        if vec is None:
            return self.miss(node, "the Mul's constant varies along a non-channel axis")
        if len(vec) > 1 and any(v < 0 for v in vec):
            return self.miss(node, "per-channel factors with negative values (needs their sign in the weights)")
        rt = _mul_absorbed(real_thresholds_of(model, node), vec)
        miss = threshold_miss(self, model, node, rt, mul.inputs[1 - c[0]])
        return miss or LinearIntoThresholds(node, mul, c[0], vec, axis, rt)

    def rewrite(self, model: "Model", match: LinearIntoThresholds) -> None:
        node, mul, vec = match.node, match.lin, match.vec
        set_channel_axis(node, match.axis)
        rt = real_thresholds_of(model, node)
        absorbed = match.rt if match.rt is not None else _mul_absorbed(rt, vec)
        if len(vec) == 1 and vec[0] < 0:
            n = rt.shape[1]
            scale = float(node.attributes["out_scale"].value) if "out_scale" in node.attributes else 1.0
            bias = float(node.attributes["out_bias"].value) if "out_bias" in node.attributes else 0.0
            node.attributes["out_scale"] = ir.AttrFloat32("out_scale", -scale)
            node.attributes["out_bias"] = ir.AttrFloat32("out_bias", bias + scale * n)
        rt = absorbed
        node.replace_input_with(0, mul.inputs[1 - match.const_index])
        model.remove_node(mul)
        store_thresholds(model, node, rt)


def _mul_absorbed(rt: RealThresholds, vec: np.ndarray) -> RealThresholds:
    """The thresholds on ``x`` for thresholds ``rt`` on ``Mul(x, vec)`` (a scalar ``vec < 0``: negated, counted
    from above; the caller changes the node's out_scale and out_bias)."""
    if len(vec) == 1 and vec[0] < 0:
        return rt.negated().scaled(np.array([-vec[0]], dtype=object))
    return rt.scaled(vec)


def _weight_channel_axis(node: ir.Node) -> int | None:
    """The output-channel axis of a MatMul ([K, N]: 1), Conv ([O, I/g, ...]: 0) or ungrouped ConvTranspose
    ([I, O, ...]: 1) weight."""
    if node.op_type == "MatMul":
        return 1
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose" and ("group" not in node.attributes or node.attributes["group"].value == 1):
        return 1
    return None


@dataclass(frozen=True, slots=True, eq=False)
class SignedScale:
    """A match of AbsorbSignIntoWeights: ``node`` (the Mul, constant at input ``const_index``) scales the output of
    the weight layers ``layers`` by ``vec`` along ``out_axis`` of its rank-``rank`` output: one layer, or the inputs
    of a Concat along that axis, each ``(layer, integer weights, signs of its output channels)``."""

    node: ir.Node
    const_index: int
    layers: list[tuple[ir.Node, np.ndarray, np.ndarray]]
    vec: np.ndarray
    rank: int
    out_axis: int


def _integer_weight_layer(v: ir.Value) -> tuple[ir.Node, np.ndarray] | None:
    """``(layer, w)`` if ``v`` is made by a Conv/MatMul/ConvTranspose with constant integer weights and feeds one
    node."""
    prod = v.producer()
    if prod is None or _weight_channel_axis(prod) is None or len(v.uses()) != 1 or v.is_graph_output():
        return None
    w = const_array(prod.inputs[1])
    if w is None or not np.array_equal(w, np.round(w)):
        return None
    return prod, w


@register_pass(group="absorb")
class AbsorbSignIntoWeights(Rule):
    """Mul(Conv/MatMul/ConvTranspose(x, W), a) with per-channel a of mixed sign → Mul(…(x, W·σ), |a|), σ = sign(a);
    likewise Mul(Concat(L₁(x₁), L₂(x₂), …), a) along the channel axis: each layer takes the signs of its channels.

    Algebra: negating output channel c of the weights negates output c, so (x·W)_c · a_c = (x·(−W))_c · |a_c|; a
    Concat only places each layer's channels (a per-branch BatchNorm moved past it keeps its signs per branch).
    Conditions: W is a constant integer tensor, each layer feeds only the Mul (or the Concat, which feeds only the
    Mul), a varies only along the output channel axis (1 for NCHW Conv outputs, last for MatMul). The weight datatype
    is widened when needed (INT4 −8 becomes 8, an INT5 value)."""

    op_types = ("Mul",)

    def match(self, model: "Model", node: ir.Node) -> SignedScale | None:
        c = const_operand(node)
        if c is None:
            return None
        x = node.inputs[1 - c[0]]
        prod = x.producer()
        rank = len(x.shape) if x.shape is not None else None
        if prod is None or rank is None or len(x.uses()) != 1:
            return None
        if prod.op_type == "Concat":
            sources = list(prod.inputs)
            axis = int(prod.attributes["axis"].value) % rank if "axis" in prod.attributes else None
        else:
            sources, axis = [x], None
        layers = [_integer_weight_layer(v) for v in sources]
        if not layers or any(lw is None for lw in layers):
            return None
        kinds = {lw[0].op_type in ("Conv", "ConvTranspose") for lw in layers}
        if len(kinds) != 1:
            return None
        out_axis = 1 if kinds.pop() else rank - 1
        if axis is not None and axis != out_axis:
            return None
        vec = channel_vector(exact_value(node, c[1]), rank, out_axis)
        if vec is None or len(vec) == 1 or not any(v < 0 for v in vec):
            return None
        signs = np.array([-1.0 if v < 0 else 1.0 for v in vec], dtype=np.float32)
        found, start = [], 0
        for v, (layer, w) in zip(sources, layers):
            n = v.shape[out_axis] if v.shape is not None else None
            if not isinstance(n, int):
                return None
            found.append((layer, w, signs[start:start + n]))
            start += n
        if start != len(vec):
            return None
        return SignedScale(node, c[0], found, vec, rank, out_axis)

    def rewrite(self, model: "Model", match: SignedScale) -> None:
        from streamline.datatypes import Range

        node, ci, vec, rank, out_axis = match.node, match.const_index, match.vec, match.rank, match.out_axis
        for prod, w, signs in match.layers:
            if np.all(signs > 0):
                continue
            waxis = _weight_channel_axis(prod)
            shape = [1] * w.ndim
            shape[waxis] = len(signs)
            new_w = (w * signs.reshape(shape)).astype(w.dtype)
            wv = model.add_initializer(new_w, prefix=f"{prod.inputs[1].name}_signed")
            model.set_tensor_datatype(wv.name, Range.of_array(new_w).datatype())
            old = prod.inputs[1]
            prod.replace_input_with(1, wv)
            model.drop_if_unused(old)
        absval = np.array([abs(v) for v in vec], dtype=object)
        shaped = shaped_for_axis(absval, rank, out_axis)
        node.replace_input_with(ci, model.add_initializer(to_float32(shaped), prefix=f"{node.name}_abs"))
        set_exact(node, shaped)


@dataclass(frozen=True, slots=True, eq=False)
class BiasAfterThresholds:
    """An Add (``node``) of the scalar integer ``bias`` to the output of MultiThreshold ``mt``, its only reader."""

    node: ir.Node
    mt: ir.Node
    bias: float


@register_pass(group="absorb")
class AbsorbSignBiasIntoMultiThreshold(Rule):
    """Add(MultiThreshold(x), b) → MultiThreshold(x) with out_bias + b, for a scalar integer b.

    Algebra: out_scale·k + out_bias + b. Condition: the MultiThreshold feeds only the Add; b is an integer so the
    output stays integer (its datatype annotation is re-inferred)."""

    op_types = ("Add",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        c = const_operand(node)
        if c is None:
            return None
        x = node.inputs[1 - c[0]]
        mt = x.producer()
        if mt is None or mt.op_type != "MultiThreshold" or len(x.uses()) != 1 or x.is_graph_output():
            return None
        if np.asarray(c[1]).size != 1 or float(np.asarray(c[1]).ravel()[0]) != int(np.asarray(c[1]).ravel()[0]):
            return self.miss(node, "bias after MultiThreshold is not a scalar integer")
        return BiasAfterThresholds(node, mt, float(np.asarray(c[1]).ravel()[0]))

    def rewrite(self, model: "Model", match: BiasAfterThresholds) -> None:
        node, mt, b = match.node, match.mt, match.bias
        bias = float(mt.attributes["out_bias"].value) if "out_bias" in mt.attributes else 0.0
        mt.attributes["out_bias"] = ir.AttrFloat32("out_bias", bias + b)
        model.replace_uses(node.outputs[0], mt.outputs[0])
        model.remove_node(node)


@register_pass(group="absorb")
class MaterializeThresholds(Transformation):
    """Re-materialize every MultiThreshold's thresholds from its real thresholds and its input's current datatype
    (integer thresholds once the input is integer). True if any threshold tensor changed."""

    def apply(self, model: Any) -> bool:
        changed = False
        for node in model.get_nodes_by_op_type("MultiThreshold"):
            changed |= materialize(model, node)
        return changed


#: The absorb rules, in the order a round applies them.
ABSORB_PASSES = [AbsorbReluIntoMultiThreshold, AbsorbSignIntoWeights, AbsorbAddIntoMultiThreshold,
                 AbsorbMulIntoMultiThreshold, AbsorbSignBiasIntoMultiThreshold]
