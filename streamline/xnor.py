"""Bipolar matrix products as XNOR-popcount, as FINN's binarized layers compute them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from custom_ops.registry import QONNX_DOMAIN
from finnlite.core.blockwise import all_in
from finnlite.core.datatypes import DataType, smallest_int_type
from finnlite.core.graphutil import add_constant, annotate, ensure_custom_domain, take_over
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from finnlite.core.tensors import DepthwiseWeight
from streamline.lower_common import attr, copy_annotations, is_op, set_attr
from streamline.real_thresholds import get_real_thresholds, set_real_thresholds

if TYPE_CHECKING:
    from finnlite.core.model import Model

#: ops between the bipolar MultiThreshold and the MatMul that only move values (and so commute with the encoding)
_MOVE_OPS = ("Transpose", "Reshape", "Flatten", "Identity", "Squeeze", "Unsqueeze", "MaxPool")
_MOVE_CUSTOM = ("Im2Col", "MaxPoolNHWC")


@dataclass(frozen=True, slots=True, eq=False)
class _XnorMatch:
    matmul: ir.Node
    weight: np.ndarray
    source: ir.Node
    chain: list[ir.Value]
    threshold: ir.Node | None


def _bipolar_multithreshold(node: ir.Node | None) -> bool:
    """A MultiThreshold producing {−1, +1}: one threshold per channel, out_scale 2, out_bias −1."""
    if not is_op(node, "MultiThreshold", custom=True):
        return False
    t = const_array(node.inputs[1])
    return (t is not None and t.ndim == 2 and t.shape[1] == 1 and float(attr(node, "out_scale", 1.0)) == 2.0
            and float(attr(node, "out_bias", 0.0)) == -1.0)


@register_pass(group="lower")
class ConvertBipolarMatMulToXnorPopcount(Rule):
    """MatMul(x, W) with x, W ∈ {−1, +1}  →  XnorPopcountMatMul(x', W') → 2·p − K.

    Pattern: a MatMul whose input comes from a bipolar MultiThreshold (out_scale 2, out_bias −1, one threshold per
    channel) through ops that only move values (Transpose, Reshape, Flatten, MaxPool(NHWC), Im2Col without
    padding), every tensor on the way read only by the next op (so the input is bipolar whatever its annotation
    says); the weight is a constant ``[K, N]`` of ±1. Algebra: with the binary encoding ``b = (v + 1)/2`` the MultiThreshold outputs
    ``x' = (x + 1)/2`` when its out_scale becomes 1 and out_bias 0 (out_dtype BINARY); moving values commutes with
    the encoding (max pooling too, the encoding being increasing); ``W' = (W + 1)/2``. XnorPopcountMatMul counts
    the agreeing positions ``p``, and ``x·w = p − (K − p) = 2p − K``. That affine fix-up is absorbed into a
    following MultiThreshold with constant thresholds where it is the MatMul's only consumer: for an integer ``p``,
    ``2p − K ≥ T ⇔ p ≥ ⌈(T + K)/2⌉`` (and exact real thresholds ``R`` become ``(R + K)/2``); otherwise it is a Mul(2)
    and an Add(−K). FINN's ConvertBipolarMatMulToXnorPopcount, with the chain checked instead of assumed."""

    op_types = ("MatMul",)

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_op(node, "MatMul", custom=False):
            return None
        x = node.inputs[0]
        compact = node.inputs[1].const_value if node.inputs[1] is not None else None
        if isinstance(compact, DepthwiseWeight) and not all_in(compact.element_values(), 1, -1):
            return None  # its zeros are not ±1: no need to make the dense matrix to see it
        w = const_array(node.inputs[1])
        if w is None or w.ndim != 2 or not all_in(w, 1, -1):
            return None
        chain: list[ir.Value] = [x]
        prod = x.producer()
        while prod is not None and not _bipolar_multithreshold(prod):
            if not (is_op(prod, *_MOVE_OPS, custom=False) or is_op(prod, *_MOVE_CUSTOM, custom=True)):
                return self._miss_if_bipolar(model, node, f"the input comes through {prod.op_type}, which does "
                                                          "not only move values")
            if prod.op_type == "Im2Col" and any(int(p) for p in attr(prod, "pad_amount", [0, 0, 0, 0])):
                return self._miss_if_bipolar(model, node, "a padding Im2Col adds zeros, which are not bipolar")
            chain.append(prod.inputs[0])
            prod = prod.inputs[0].producer()
        if prod is None:
            return self._miss_if_bipolar(model, node, "no bipolar MultiThreshold produces the input")
        if any(len(v.uses()) != 1 or v.is_graph_output() for v in chain):
            return self.miss(node, "the bipolar activation has other consumers")
        y = node.outputs[0]
        uses = list(y.uses())
        threshold = None
        if len(uses) == 1 and not y.is_graph_output() and uses[0].idx == 0 and \
                is_op(uses[0].node, "MultiThreshold", custom=True) and const_array(uses[0].node.inputs[1]) is not None:
            threshold = uses[0].node
        return _XnorMatch(node, w, prod, chain, threshold)

    def _miss_if_bipolar(self, model: "Model", node: ir.Node, reason: str) -> Any:
        """A miss worth reporting only where the input claims to be bipolar (±1 weights alone are common)."""
        if model.get_tensor_datatype(node.inputs[0].name) == DataType["BIPOLAR"]:
            return self.miss(node, reason)
        return None

    def rewrite(self, model: "Model", m: _XnorMatch) -> None:
        ensure_custom_domain(model)
        mt = m.source
        set_attr(mt, ir.AttrFloat32("out_scale", 1.0))
        set_attr(mt, ir.AttrFloat32("out_bias", 0.0))
        set_attr(mt, ir.AttrString("out_dtype", "BINARY"))
        for v in m.chain:
            model.set_tensor_datatype(v.name, "BINARY")
        k = m.weight.shape[0]
        node, y = m.matmul, m.matmul.outputs[0]
        name = node.name or "MatMul"
        binary = np.add(m.weight, 1, dtype=np.float32)  # (W + 1)/2, made in the one array the model keeps
        binary *= 0.5
        w_bin = add_constant(model, binary, f"{name}_Wbin", "BINARY")
        p = model.make_value_like(y, f"{name}_popcount")
        annotate(p, smallest_int_type(0, k))
        xnor = ir.Node(QONNX_DOMAIN, "XnorPopcountMatMul", [node.inputs[0], w_bin], outputs=[p], name=name)
        model.graph.insert_after(node, xnor)
        if m.threshold is not None:
            self._absorb_fixup(model, m.threshold, p, k)
        else:
            two = add_constant(model, np.array([2.0], np.float32), f"{name}_two")
            minus_k = add_constant(model, np.array([-k], np.float32), f"{name}_minus_k")
            doubled = model.make_value_like(y, f"{name}_2p")
            annotate(doubled, smallest_int_type(0, 2 * k))
            out = model.make_value_like(y, f"{name}_dot")
            copy_annotations(model, y, out, layout=True)
            model.graph.insert_after(xnor, [
                ir.Node("", "Mul", [p, two], outputs=[doubled], name=f"{name}_mul2"),
                ir.Node("", "Add", [doubled, minus_k], outputs=[out], name=f"{name}_subk")])
            take_over(model, y, out)
        weight = node.inputs[1]
        model.remove_node(node)
        model.drop_if_unused(weight)

    @staticmethod
    def _absorb_fixup(model: "Model", mt: ir.Node, p: ir.Value, k: int) -> None:
        """MultiThreshold(2p − K, T)  →  MultiThreshold(p, ⌈(⌈T⌉ + K)/2⌉) clipped to [0, K + 1] (p lies in
        [0, K]: a threshold at or below 0 is always passed, one above K never); real thresholds ``(R + K)/2``."""
        t = const_array(mt.inputs[1]).astype(np.float64)
        new_t = np.clip(np.ceil((np.ceil(t) + k) / 2), 0, k + 1).astype(np.float32)
        t_val = add_constant(model, new_t, f"{mt.name or 'MultiThreshold'}_thresholds", smallest_int_type(0, k + 1))
        rt = get_real_thresholds(mt)
        if rt is not None:
            set_real_thresholds(mt, rt.shifted(np.array(-k, dtype=np.float64)).scaled(np.array(2.0)))
        old = mt.inputs[1]
        mt.replace_input_with(1, t_val)
        mt.replace_input_with(0, p)
        model.drop_if_unused(old)
