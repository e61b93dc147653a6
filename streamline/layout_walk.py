"""The walk behind :class:`streamline.layout.ConvertToNHWC`: one pass over the graph in topological order.

Every tensor ``t`` of the original graph is represented by a :class:`Rep`: a tensor ``u`` of the rewritten graph
and a permutation ``perm`` with ``u = t.transpose(perm)``, or, for a 2-D tensor after a flatten, a column order
``cols`` with ``u = t[:, cols]``. Each node is rewritten to compute the representation of its outputs from the
representations of its inputs; where an op has no rule, its inputs are transposed back (``materialize``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import onnx_ir as ir

from custom_ops.multithreshold import channel_axis_of
from finnlite.core.errors import PassError
from finnlite.core.graphutil import add_constant, rank_of, reorder_channels
from finnlite.core.passes import Miss
from finnlite.core.shapes import const_array
from streamline.exact import EXACT_KEY, exact_value, set_exact
from streamline.algebra import movement
from streamline.layout_reshape import reshape_in_place, reshape_target
from streamline.lower_common import (TO_NHWC, Perm, annotated_or_values, attr, copy_annotations, identity, inverse,
                                     is_op, new_value, permute_layout, set_attr, then, transpose_perm)
from streamline.real_thresholds import get_real_thresholds, set_real_thresholds

if TYPE_CHECKING:
    from finnlite.core.model import Model

#: standard ops that act elementwise, broadcasting their operands (numpy rules)
ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Pow", "Mod", "PRelu", "Where", "Equal", "Less",
    "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "BitShift", "Relu", "Neg", "Abs", "Clip",
    "Round", "Floor", "Ceil", "Sign", "Identity", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "HardSigmoid",
    "HardSwish", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Not", "Cast", "Softplus", "Softsign", "IsNaN", "IsInf",
})
#: custom ops that act elementwise with broadcast parameters
ELEMENTWISE_CUSTOM = frozenset({"Quant", "IntQuant", "BipolarQuant", "Trunc"})
#: the layout letters assumed for an unannotated tensor of each rank
DEFAULT_LAYOUT = {4: ["N", "C", "H", "W"], 2: ["N", "C"]}


@dataclass(frozen=True)
class Rep:
    """``value = original.transpose(perm)``, or ``value = original[:, cols]`` if ``cols`` is set (rank 2)."""

    value: ir.Value
    perm: Perm
    cols: tuple[int, ...] | None = None

    @property
    def plain(self) -> bool:
        return self.cols is None and self.perm == identity(len(self.perm))


def _shape(v: ir.Value) -> tuple[int, ...] | None:
    if v.shape is None:
        arr = const_array(v)
        return None if arr is None else tuple(arr.shape)
    return tuple(d if isinstance(d, int) else -1 for d in v.shape)


def _permute_exact(node: ir.Node, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    """Apply to the exact constant a Mul/Add node carries (:mod:`streamline.exact`) the permutation ``fn`` just
    applied to its float32 constant, so that the two keep describing the same tensor."""
    if node.metadata_props.get(EXACT_KEY):
        set_exact(node, fn(exact_value(node, np.zeros(0))))


def _is_elementwise(node: ir.Node) -> bool:
    return is_op(node, *ELEMENTWISE, custom=False) or is_op(node, *ELEMENTWISE_CUSTOM, custom=True)


class LayoutWalk:
    """One NCHW → NHWC conversion of ``model`` (see the module docstring); ``edits`` counts structural changes."""

    def __init__(self, model: "Model", pass_name: str = "ConvertToNHWC") -> None:
        self.model = model
        self.pass_name = pass_name
        self.env: dict[ir.Value, Rep] = {}
        self.logical: dict[ir.Value, list[str] | None] = {}
        self.consts: dict[tuple[ir.Value, object], ir.Value] = {}
        self.transposes: dict[tuple[ir.Value, Perm], ir.Value] = {}
        self.bypassed: list[ir.Node] = []
        self.misses: list[Miss] = []
        self.edits = 0

    # -- representations ---------------------------------------------------------------------------------------
    def rep(self, v: ir.Value) -> Rep:
        r = self.env.get(v)
        if r is None:
            rank = rank_of(v)
            r = Rep(v, identity(rank) if rank is not None else ())
        return r

    def _logical_layout(self, v: ir.Value) -> list[str] | None:
        if v not in self.logical:
            lay = self.model.get_tensor_layout(v.name) if v.name else None
            if lay is None or len(lay) != (rank_of(v) or 0):
                lay = DEFAULT_LAYOUT.get(rank_of(v) or 0)
            self.logical[v] = lay
        return self.logical[v]

    def _record(self, original: ir.Value, rep: Rep) -> None:
        self._logical_layout(original)
        self.env[original] = rep

    def _set_output(self, out: ir.Value, perm: Perm, cols: tuple[int, ...] | None = None) -> None:
        """``out`` (an output of a rewritten node) now holds the original ``out`` permuted by ``perm``/``cols``."""
        self._logical_layout(out)
        shape = _shape(out)
        if shape is not None and cols is None and len(perm) == len(shape):
            out.shape = ir.Shape([shape[i] for i in perm])
        self.env[out] = Rep(out, perm, cols)

    # -- edits ---------------------------------------------------------------------------------------------------
    def _miss(self, node: ir.Node, reason: str) -> None:
        self.misses.append(Miss(self.pass_name, node.name or node.op_type, reason))

    def materialize(self, original: ir.Value, target: Perm, before: ir.Node | None) -> ir.Value:
        """A tensor equal to ``original.transpose(target)``: the representation itself, or a Transpose of it
        inserted before ``before`` (at the end of the graph if None)."""
        r = self.rep(original)
        if r.cols is not None:
            raise PassError(f"internal: cannot undo the feature order of '{original.name}' (a flatten consumer "
                            "was admitted without a rule)", tensor=original.name)
        if r.perm == target:
            return r.value
        key = (r.value, target)
        if key not in self.transposes:
            perm = then(inverse(r.perm), target)
            shape = _shape(r.value)
            out = new_value(self.model, f"{original.name}_t", [shape[i] for i in perm] if shape else None, None)
            copy_annotations(self.model, r.value, out)
            label = before.name or before.op_type if before is not None else original.name
            node = ir.Node("", "Transpose", [r.value], attributes=[ir.AttrInt64s("perm", list(perm))],
                           outputs=[out], name=f"{label}_layout_{len(self.transposes)}")
            if before is None:
                self.model.graph.append(node)
            else:
                self.model.graph.insert_before(before, node)
            self.transposes[key] = out
            lay = self._logical_layout(original)
            self.logical[out] = permute_layout(lay, target) if lay is not None else None
            self.env[out] = Rep(out, identity(len(perm)))
            self.edits += 1
        return self.transposes[key]

    def _permuted_const(self, v: ir.Value, arr: np.ndarray, key: object, fn: Callable[[np.ndarray], np.ndarray]
                        ) -> ir.Value:
        k = (v, key)
        if k not in self.consts:
            new = add_constant(self.model, fn(arr), f"{v.name}_nhwc", annotated_or_values(self.model, v, arr))
            self.consts[k] = new
        return self.consts[k]

    def _set_input(self, node: ir.Node, i: int, value: ir.Value) -> None:
        old = node.inputs[i]
        if old is not value:
            node.replace_input_with(i, value)
            self.model.drop_if_unused(old)
            self.edits += 1

    # -- the walk ----------------------------------------------------------------------------------------------
    def insert_input_transposes(self) -> None:
        """Represent each 4-D NCHW graph input ``x`` by ``Transpose(x, NCHW→NHWC)``, unless its only consumer is
        already that Transpose. The Transpose is kept; its consumers read the NHWC tensor."""
        graph = self.model.graph
        for x in list(graph.inputs):
            if rank_of(x) != 4 or self._logical_layout(x) != DEFAULT_LAYOUT[4]:
                continue
            uses = list(x.uses())
            if not uses:
                continue
            if len(uses) == 1 and is_op(uses[0].node, "Transpose", custom=False) \
                    and transpose_perm(uses[0].node, 4) == TO_NHWC:
                continue
            shape = _shape(x)
            t = new_value(self.model, f"{x.name}_nhwc", [shape[i] for i in TO_NHWC] if shape else None, None,
                          ["N", "H", "W", "C"])
            copy_annotations(self.model, x, t)
            node = ir.Node("", "Transpose", [x], attributes=[ir.AttrInt64s("perm", list(TO_NHWC))], outputs=[t],
                           name=f"{x.name}_to_nhwc")
            graph.insert_before(next(iter(graph)), node)
            for u in uses:
                u.node.replace_input_with(u.idx, t)
            self.model.set_tensor_layout(x.name, DEFAULT_LAYOUT[4])
            self.edits += 1
            # the consumers now read t in place of x: t represents x, permuted
            self.env[t] = Rep(t, TO_NHWC)
            self.logical[t] = DEFAULT_LAYOUT[4]

    def run(self) -> None:
        """Rewrite every node, restore the graph outputs' layout, drop the bypassed Transposes, annotate layouts."""
        for node in list(self.model.graph):
            self.visit(node)
        self._restore_outputs()
        for node in reversed(self.bypassed):
            self.model.remove_node(node)
        self._annotate()

    def visit(self, node: ir.Node) -> None:
        reps = [None if v is None else self.rep(v) for v in node.inputs]
        if is_op(node, "Transpose", custom=False) and not node.inputs[0].is_graph_input() \
                and const_array(node.inputs[0]) is None:
            self._transpose(node, reps[0])
            return
        if all(r is None or r.plain for r in reps) and not self._unsqueezes_to_nhwc(node):
            for i, (v, r) in enumerate(zip(node.inputs, reps)):
                if r is not None and r.value is not v:
                    self._set_input(node, i, r.value)  # behind a removed Transpose pair
            for out in node.outputs:
                self._logical_layout(out)
            return
        if is_op(node, "MultiThreshold", custom=True):
            self._multithreshold(node, reps)
        elif is_op(node, "QuantAvgPool2d", custom=True):
            self._quantavgpool(node, reps)
        elif is_op(node, "ReduceSum", "ReduceMax", "ReduceMin", custom=False):
            self._reduce(node, reps)
        elif _is_elementwise(node):
            self._elementwise(node, reps)
        elif is_op(node, "Concat", custom=False):
            self._concat(node, reps)
        elif is_op(node, "Flatten", "Reshape", "Squeeze", "Unsqueeze", custom=False):
            self._reshape(node, reps)
        elif is_op(node, "Resize", "Upsample", custom=False) and movement(node) is not None:
            self._resize(node, reps)
        elif is_op(node, "Gather", custom=False):
            self._gather(node, reps)
        elif is_op(node, "MatMul", custom=False):
            self._matmul(node, reps)
        else:
            self._fallback(node, f"{node.op_type} has no NHWC rule")

    # -- rules -------------------------------------------------------------------------------------------------------
    def _fallback(self, node: ir.Node, reason: str) -> None:
        """Feed ``node`` its inputs in their original layout (a Transpose where they are permuted)."""
        transposed = False
        for i, v in enumerate(node.inputs):
            if v is None:
                continue
            r = self.rep(v)
            if r.plain and r.value is v:
                continue
            if not r.plain:
                transposed = True
            self._set_input(node, i, self.materialize(v, identity(len(r.perm)), node))
        if transposed:
            self._miss(node, f"{reason}: Transpose to the original layout inserted")
        for out in node.outputs:
            self._logical_layout(out)

    def _transpose(self, node: ir.Node, r: Rep) -> None:
        """Transpose(q) of a tensor represented by ``u = t.transpose(p)``: its output ``t.transpose(q)`` is
        represented by the same ``u`` with ``q⁻¹ ∘ p``; the node is removed at the end."""
        q = transpose_perm(node, len(r.perm))
        if r.cols is not None or not r.perm or len(q) != len(r.perm):
            self._fallback(node, "Transpose of a tensor of unknown rank or feature order")
            return
        self._record(node.outputs[0], Rep(r.value, then(inverse(q), r.perm)))
        self.bypassed.append(node)
        self.edits += 1

    def _constant_operand(self, node: ir.Node, i: int, arr: np.ndarray, perm: Perm, rank: int) -> None:
        """Transpose constant input ``i`` (broadcasting against a rank-``rank`` tensor, so of rank ≤ ``rank``:
        missing leading axes are 1) by ``perm``, and the node's exact constant with it."""
        if arr.size == 1 or perm == identity(rank):
            return

        def fn(a: np.ndarray) -> np.ndarray:
            return a.reshape((1,) * (rank - a.ndim) + a.shape).transpose(perm)

        self._set_input(node, i, self._permuted_const(node.inputs[i], arr, ("perm", perm, rank), fn))
        _permute_exact(node, fn)

    def _elementwise(self, node: ir.Node, reps: list[Rep | None]) -> None:
        out_rank = rank_of(node.outputs[0])
        dyn = [(i, v, r) for i, (v, r) in enumerate(zip(node.inputs, reps))
               if v is not None and r is not None and const_array(v) is None]
        cols = next((r.cols for _, _, r in dyn if r.cols is not None), None)
        if cols is not None:
            self._elementwise_cols(node, dyn, cols)
            return
        if out_rank is None or any(len(r.perm) != out_rank for _, _, r in dyn):
            self._fallback(node, "broadcast of dynamic operands of different ranks")
            return
        consts = {i: const_array(v) for i, v in enumerate(node.inputs) if v is not None and i not in
                  {j for j, _, _ in dyn}}
        if any(arr is None or arr.ndim > out_rank for arr in consts.values()):
            self._fallback(node, "an operand that does not broadcast")
            return
        target = next((r.perm for _, _, r in dyn if not r.plain), identity(out_rank))
        for i, arr in consts.items():
            self._constant_operand(node, i, arr, target, out_rank)
        for i, v, _ in dyn:
            self._set_input(node, i, self.materialize(v, target, node))
        for out in node.outputs:
            self._set_output(out, target)

    def _elementwise_cols(self, node: ir.Node, dyn: list, cols: tuple[int, ...]) -> None:
        for _, v, r in dyn:
            if r.cols != cols:
                raise PassError("internal: operands with different feature orders", node=node.name)
        idx = np.asarray(cols)
        for i, v in enumerate(node.inputs):
            if v is None:
                continue
            arr = const_array(v)
            if arr is None:
                self._set_input(node, i, self.rep(v).value)
            elif arr.size != 1:
                fn: Callable[[np.ndarray], np.ndarray] = lambda a: a.reshape(1, -1)[:, idx]  # noqa: E731
                self._set_input(node, i, self._permuted_const(v, arr, ("cols", cols), fn))
                _permute_exact(node, fn)
        self._set_output(node.outputs[0], identity(2), cols)

    def _multithreshold(self, node: ir.Node, reps: list[Rep | None]) -> None:
        """The thresholds stay; the channel axis moves: ``data_layout`` becomes the permuted layout. After a
        flatten the channels are the features: per-feature threshold rows (and real thresholds) are permuted."""
        r, t = reps[0], const_array(node.inputs[1])
        if r is None or t is None:
            self._fallback(node, "MultiThreshold without constant thresholds")
            return
        self._set_input(node, 0, r.value)
        if r.cols is not None:
            if t.shape[0] == len(r.cols):
                idx = np.asarray(r.cols)
                self._set_input(node, 1, self._permuted_const(node.inputs[1], t, ("rows", r.cols),
                                                              lambda a: a[idx]))
                rt = get_real_thresholds(node)
                if rt is not None and rt.shape[0] == len(idx):
                    set_real_thresholds(node, rt.rows(idx))
            reorder_channels(node, r.cols)
            self._set_output(node.outputs[0], identity(2), r.cols)
            return
        rank = len(r.perm)
        layout = str(attr(node, "data_layout", "") or "")
        if len(layout) != rank:  # qonnx's guess from the rank, spelled out
            letters = list("NHWDEFGIJK"[:rank - 1])
            letters.insert(channel_axis_of(layout, rank), "C")
            layout = "".join(letters)
        set_attr(node, ir.AttrString("data_layout", "".join(permute_layout(list(layout), r.perm))))
        self.edits += 1
        self._set_output(node.outputs[0], r.perm)

    def _reduce(self, node: ir.Node, reps: list[Rep | None]) -> None:
        """A reduction over axes A of ``t``, given ``u = t.transpose(p)``: reduce ``u`` over ``{j : p[j] ∈ A}``
        (axes input or attribute renumbered). With keepdims the output keeps ``p``; without, ``p`` restricted to the
        kept axes, renumbered."""
        from streamline.reduce import reduce_axes

        r, axes = reps[0], reduce_axes(node)
        if r is None or r.cols is not None or axes is None or len(r.perm) != rank_of(node.inputs[0]):
            self._fallback(node, f"{node.op_type} of a tensor of unknown rank, axes or feature order")
            return
        new_axes = [j for j, a in enumerate(r.perm) if a in axes]
        self._set_input(node, 0, r.value)
        if "axes" in node.attributes:
            set_attr(node, ir.AttrInt64s("axes", new_axes))
        else:
            arr = np.asarray(new_axes, np.int64)
            k = add_constant(self.model, arr, f"{node.name}_axes_nhwc", None)
            if len(node.inputs) > 1:
                self._set_input(node, 1, k)
            else:
                node.resize_inputs(2)
                node.replace_input_with(1, k)
        keep = attr(node, "keepdims", 1)
        if keep is None or int(keep):
            out_perm = r.perm
        else:
            kept = [a for a in r.perm if a not in axes]
            order = sorted(kept)
            out_perm = tuple(order.index(a) for a in kept)
        self._set_output(node.outputs[0], tuple(out_perm))
        self.edits += 1

    def _quantavgpool(self, node: ir.Node, reps: list[Rep | None]) -> None:
        r = reps[0]
        layout = str(attr(node, "data_layout", "NCHW") or "NCHW")
        if r is None or r.cols is not None or len(r.perm) != 4:
            self._fallback(node, "QuantAvgPool2d input is not 4-D")
            return
        new_layout = "".join(permute_layout(list(layout), r.perm))
        if new_layout not in ("NCHW", "NHWC"):
            self._fallback(node, f"QuantAvgPool2d has no layout {new_layout}")
            return
        self._set_input(node, 0, r.value)
        set_attr(node, ir.AttrString("data_layout", new_layout))
        self.edits += 1
        self._set_output(node.outputs[0], r.perm)

    def _concat(self, node: ir.Node, reps: list[Rep | None]) -> None:
        rank = rank_of(node.outputs[0])
        dyn = [r for v, r in zip(node.inputs, reps) if v is not None and r is not None and const_array(v) is None]
        if rank == 2 and any(r.cols is not None for r in dyn) and int(attr(node, "axis", 0)) % 2 == 1:
            self._concat_cols(node, reps)
            return
        if rank is None or any(r.cols is not None or len(r.perm) != rank for r in dyn):
            self._fallback(node, "Concat of tensors of another rank or feature order")
            return
        target = next((r.perm for r in dyn if not r.plain), identity(rank))
        for i, v in enumerate(node.inputs):
            arr = const_array(v)
            if arr is not None:
                if target != identity(rank):
                    self._set_input(node, i, self._permuted_const(v, arr, ("perm", target, rank),
                                                                  lambda a: a.transpose(target)))
            else:
                self._set_input(node, i, self.materialize(v, target, node))
        axis = int(attr(node, "axis", 0)) % rank
        set_attr(node, ir.AttrInt64("axis", target.index(axis)))
        self._set_output(node.outputs[0], target)

    def _concat_cols(self, node: ir.Node, reps: list[Rep | None]) -> None:
        """A Concat of ``[N, F_k]`` features along axis 1, some of them in a feature order (after a flatten): the
        result is in the order of the orders, each shifted past the features before it (the consumers, checked by
        :meth:`sinkable`, take it)."""
        cols: list[int] = []
        for i, (v, r) in enumerate(zip(node.inputs, reps)):
            shape = _shape(r.value) if r is not None else None
            if r is None or const_array(v) is not None or shape is None or len(shape) != 2 or \
                    (r.cols is None and not r.plain):
                raise PassError("internal: a Concat of features admitted without a rule", node=node.name)
            order = r.cols if r.cols is not None else tuple(range(shape[1]))
            offset = len(cols)
            cols.extend(offset + c for c in order)
            self._set_input(node, i, r.value)
        self._set_output(node.outputs[0], identity(2), tuple(cols))

    def _reshape(self, node: ir.Node, reps: list[Rep | None]) -> None:
        """A Reshape (Flatten, Squeeze, Unsqueeze) of ``u = t.transpose(p)``: where its groups of axes stay whole
        and in order in ``u``, a Reshape of ``u`` itself (:func:`streamline.layout_reshape.reshape_in_place`); else
        a flatten to ``[N, F]`` is kept as ``flat(t)[:, cols]`` when every consumer can take the feature order
        (:meth:`sinkable`); else one Transpose of ``u`` first puts the groups in order, chosen so that the result is
        NHWC (a 4-D NCHW tensor) or in its original layout (a graph output, other ranks)."""
        r, out = reps[0], node.outputs[0]
        phys, out_shape = (_shape(r.value) if r is not None else None), _shape(out)
        if r is None or r.cols is not None or phys is None or out_shape is None or len(phys) != len(r.perm) \
                or any(d < 0 for d in phys) or any(d < 0 for d in out_shape):
            self._fallback(node, f"{node.op_type} of a tensor without static shape or with a feature order")
            return
        in_shape = tuple(phys[i] for i in inverse(r.perm))  # the original tensor's shape
        preferred = None
        if self._feeds_output(out):
            preferred = identity(len(out_shape))
        elif len(out_shape) == 4 and self._logical_layout(out) == DEFAULT_LAYOUT[4]:
            preferred = TO_NHWC
        q = reshape_in_place(r.perm, in_shape, out_shape, preferred)
        if q is not None:
            self._as_reshape(node, r.value, [out_shape[b] for b in q])
            self._set_output(out, q)
            return
        flatten = (len(out_shape) == 2 and out_shape[0] == in_shape[0] and r.perm and r.perm[0] == 0
                   and (node.op_type == "Reshape" or (node.op_type == "Flatten" and int(attr(node, "axis", 1)) == 1)))
        if flatten:
            inner = [p - 1 for p in r.perm[1:]]
            cols = tuple(int(c) for c in np.arange(int(np.prod(in_shape[1:]))).reshape(in_shape[1:])
                         .transpose(inner).ravel())
            if self.sinkable(out, len(cols)):
                self._as_reshape(node, r.value, list(out_shape))
                self._set_output(out, identity(2), cols)
                return
        target, q = reshape_target(in_shape, out_shape, preferred or identity(len(out_shape)))
        if target != r.perm:
            self._miss(node, "the reshaped axes are not in order in the NHWC tensor: Transpose to "
                       + ("the original order inserted" if target == identity(len(target)) else
                          f"the order {list(target)} inserted"))
        self._as_reshape(node, self.materialize(node.inputs[0], target, node), [out_shape[b] for b in q])
        self._set_output(out, q)

    def _unsqueezes_to_nhwc(self, node: ir.Node) -> bool:
        """True for a reshape of a tensor in its original layout to a 4-D NCHW tensor that it can write in NHWC
        directly (``[N, C] → [N, C, 1, 1]``: a gate broadcast against feature maps), not to a graph output."""
        if not is_op(node, "Reshape", "Unsqueeze", "Flatten", "Squeeze", custom=False):
            return False
        out, x = node.outputs[0], node.inputs[0]
        s_in, s_out = (_shape(x) if x is not None else None), _shape(out)
        if s_in is None or s_out is None or len(s_out) != 4 or len(s_in) == 4 or self._feeds_output(out) or \
                any(d < 0 for d in s_in + s_out) or self._logical_layout(out) != DEFAULT_LAYOUT[4]:
            return False
        return reshape_in_place(identity(len(s_in)), s_in, s_out, TO_NHWC) == TO_NHWC

    @staticmethod
    def _feeds_output(v: ir.Value) -> bool:
        """True if ``v`` is a graph output, or reaches one through single-consumer elementwise ops with scalar
        constants only (the output dequantization): its layout there is the original one."""
        while not v.is_graph_output():
            uses = list(v.uses())
            if len(uses) != 1:
                return False
            n = uses[0].node
            if not _is_elementwise(n) or len(n.outputs) != 1 or any(
                    w is not None and w is not v and (const_array(w) is None or const_array(w).size != 1)
                    for w in n.inputs):
                return False
            v = n.outputs[0]
        return True

    def _as_reshape(self, node: ir.Node, data: ir.Value, shape: list[int]) -> None:
        """Make ``node`` a Reshape of ``data`` to the constant ``shape`` (a Squeeze or Unsqueeze becomes one; a
        Flatten that gives that shape stays a Flatten)."""
        phys = _shape(data)
        if node.op_type == "Flatten" and phys is not None and len(shape) == 2:
            axis = int(attr(node, "axis", 1)) % max(len(phys), 1)
            if [int(np.prod(phys[:axis])), int(np.prod(phys[axis:]))] == list(shape):
                self._set_input(node, 0, data)
                return
        k = add_constant(self.model, np.asarray(shape, np.int64), f"{node.name or 'reshape'}_shape", None)
        if node.op_type != "Reshape":
            node.op_type = "Reshape"
            node.attributes.clear()
            old = [v for v in node.inputs[1:] if v is not None]
            node.resize_inputs(2)
            self.model.drop_if_unused(*old)
        old_shape = node.inputs[1]
        if old_shape is not None and const_array(old_shape) is not None and \
                list(np.asarray(const_array(old_shape)).ravel()) == shape:
            self.model.drop_if_unused(k)
        else:
            self._set_input(node, 1, k)
        self._set_input(node, 0, data)
        self.edits += 1

    def _resize(self, node: ir.Node, reps: list[Rep | None]) -> None:
        """A nearest-neighbour Resize of ``u = t.transpose(p)`` is the Resize of ``u`` with its per-axis ``roi``,
        ``scales`` and ``sizes`` (and ``axes``) permuted the same way: each axis is resampled on its own."""
        r = reps[0]
        rank = len(r.perm) if r is not None else None
        if r is None or r.cols is not None or rank is None or "axes" in node.attributes or \
                any(v is not None and const_array(v) is None for v in node.inputs[1:]):
            self._fallback(node, "Resize with dynamic or per-axis-subset parameters")
            return
        perm = np.asarray(r.perm)
        for i, v in enumerate(node.inputs[1:], start=1):
            arr = const_array(v) if v is not None else None
            if arr is None or arr.size == 0:
                continue
            if node.op_type == "Resize" and i == 1:  # roi: [starts..., ends...]
                if arr.size != 2 * rank:
                    self._fallback(node, "a Resize roi that does not match the rank")
                    return
                fn: Callable[[np.ndarray], np.ndarray] = lambda a: np.concatenate([a[:rank][perm], a[rank:][perm]])
            elif arr.size == rank:
                fn = lambda a: a[perm]  # noqa: E731
            else:
                self._fallback(node, "Resize parameters that do not match the rank")
                return
            self._set_input(node, i, self._permuted_const(v, arr, ("axes", r.perm), fn))
        self._set_input(node, 0, r.value)
        self._set_output(node.outputs[0], r.perm)

    def _gather(self, node: ir.Node, reps: list[Rep | None]) -> None:
        """A Gather with constant indices along axis a of ``u = t.transpose(p)`` is the Gather along ``p⁻¹(a)``;
        scalar indices remove that axis (the permutation of the others is renumbered)."""
        r, idx = reps[0], const_array(node.inputs[1])
        if r is None or r.cols is not None or idx is None or idx.ndim > 1 or not r.perm:
            self._fallback(node, "Gather of dynamic or multi-dimensional indices")
            return
        rank = len(r.perm)
        axis = int(attr(node, "axis", 0)) % rank
        set_attr(node, ir.AttrInt64("axis", r.perm.index(axis)))
        self._set_input(node, 0, r.value)
        if idx.ndim == 1:
            self._set_output(node.outputs[0], r.perm)
        else:
            kept = [a for a in r.perm if a != axis]
            self._set_output(node.outputs[0], tuple(a - (a > axis) for a in kept))
        self.edits += 1

    def sinkable(self, v: ir.Value, features: int) -> bool:
        """True if every path from ``v`` ends in a MatMul with a constant weight, passing only through
        MultiThresholds, elementwise ops with scalar or per-feature constants and Concats along the features (the
        ops that have a rule for a feature order), and ``v`` reaches no graph output."""
        stack, seen = [(v, features)], set()
        while stack:
            cur, feats = stack.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if cur.is_graph_output():
                return False
            for use in cur.uses():
                n = use.node
                if use.idx == 0 and is_op(n, "MatMul", custom=False):
                    w = const_array(n.inputs[1])
                    if w is None or w.ndim != 2 or w.shape[0] != feats:
                        return False
                elif use.idx == 0 and is_op(n, "MultiThreshold", custom=True) and \
                        const_array(n.inputs[1]) is not None:
                    stack.append((n.outputs[0], feats))
                elif is_op(n, "Concat", custom=False) and int(attr(n, "axis", 0)) in (1, -1):
                    shapes = [_shape(w) for w in n.inputs]
                    if any(s is None or len(s) != 2 or s[1] < 0 for s in shapes):
                        return False
                    stack.append((n.outputs[0], sum(s[1] for s in shapes)))
                elif _is_elementwise(n) and len(n.outputs) == 1:
                    for j, other in enumerate(n.inputs):
                        if other is None or j == use.idx:
                            continue
                        arr = const_array(other)
                        if arr is None or (arr.size != 1 and arr.size != feats) or \
                                (arr.size == feats and arr.shape[-1] != feats):
                            return False
                    stack.append((n.outputs[0], feats))
                else:
                    return False
        return True

    def _matmul(self, node: ir.Node, reps: list[Rep | None]) -> None:
        """``u @ W`` with a constant ``W``: a feature order becomes an order of W's rows; a permutation that keeps
        the last axis last commutes with the product."""
        r, w = reps[0], const_array(node.inputs[1])
        if r is None or w is None or w.ndim != 2 or (reps[1] is not None and not reps[1].plain):
            self._fallback(node, "MatMul without a constant 2-D weight")
            return
        if r.cols is not None:
            idx = np.asarray(r.cols)
            self._set_input(node, 0, r.value)
            self._set_input(node, 1, self._permuted_const(node.inputs[1], w, ("rows", r.cols), lambda a: a[idx]))
            self._set_output(node.outputs[0], identity(2))
            return
        rank = len(r.perm)
        if rank < 2 or r.perm[-1] != rank - 1:
            self._fallback(node, "MatMul over a permuted last axis")
            return
        self._set_input(node, 0, r.value)
        self._set_output(node.outputs[0], r.perm)

    # -- the end -------------------------------------------------------------------------------------------------
    def _restore_outputs(self) -> None:
        """Give every graph output its original layout and name (a Transpose back where it is permuted)."""
        graph = self.model.graph
        for k, o in enumerate(list(graph.outputs)):
            r = self.env.get(o)
            if r is None or (r.plain and r.value is o):
                continue
            if r.plain:
                value = r.value
                if value.is_graph_input() or value.is_graph_output():
                    value = new_value(self.model, f"{o.name}_id", _shape(value), None)
                    copy_annotations(self.model, r.value, value)
                    graph.append(ir.Node("", "Identity", [r.value], outputs=[value], name=f"{o.name}_identity"))
            else:
                self._miss_output(o)
                value = self.materialize(o, identity(len(r.perm)), None)
            lay = self._logical_layout(o)
            name = o.name
            o.name = self.model.make_new_valueinfo_name(f"{name}_internal")
            graph.outputs[k] = value
            value.name = name
            self.model.index_value(value)
            self.env[value] = Rep(value, identity(len(r.perm)))
            self.logical[value] = lay
            self.edits += 1

    def _miss_output(self, o: ir.Value) -> None:
        self.misses.append(Miss(self.pass_name, o.name, "a 4-D graph output keeps its layout: Transpose inserted"))

    def _annotate(self) -> None:
        """``tensor_layout`` of every tensor the walk saw that is still in the graph: its original layout, permuted
        as its representation is."""
        for original, lay in self.logical.items():
            if lay is None:
                continue
            r = self.env.get(original) or Rep(original, identity(len(lay)))
            v, producer = r.value, r.value.producer()
            alive = v.is_graph_input() or (producer is not None and producer.graph is self.model.graph)
            if not alive or (r.cols is None and len(r.perm) != len(lay)):
                continue
            self.model.set_tensor_layout(v.name, lay if r.cols is not None else permute_layout(lay, r.perm))
