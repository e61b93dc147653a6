"""Channel permutations (a ShuffleNet channel shuffle) as a Gather, moved forward and absorbed into weights.

A channel shuffle is written Reshape → Transpose → Reshape; by its element map it only reorders the channels, which
:class:`CollapseDataMovement` finds and writes as one ``Gather(axis=1)`` with constant indices. A Gather of channels
commutes with every op that treats channels one by one (a depthwise Conv with its kernels reordered, pools;
thresholds, by :class:`streamline.move.MoveDataMovementPastElementwise`), and disappears into the next layer that
mixes channels: its weight's input channels are reordered (:class:`AbsorbChannelGatherIntoWeights`). So the shuffle
costs nothing in the integer model: no Transpose, no layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from finnlite.core.graphutil import add_constant, annotate, is_standard_domain, reorder_channels
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.algebra import data_inputs, element_map_of, mixing, movement, static_shape

if TYPE_CHECKING:
    from finnlite.core.model import Model


def _chain(node: ir.Node) -> list[ir.Node]:
    """The single-input data-movement ops ending at ``node`` whose intermediate outputs feed only the next one,
    first op first."""
    chain = [node]
    while True:
        head = chain[0]
        x = head.inputs[0]
        prev = x.producer() if x is not None else None
        if prev is None or len(x.uses()) != 1 or x.is_graph_output() or len(prev.outputs) != 1:
            break
        decl = movement(prev)
        if decl is None or len(data_inputs(prev, decl)) != 1 or decl.fill is not None:
            break
        chain.insert(0, prev)
    return chain


def single_axis_gather(src: np.ndarray, in_shape: list[int]) -> tuple[int, np.ndarray] | None:
    """``(axis, indices)`` if the element map ``src`` (over an output of ``in_shape``) takes every element from the
    same position but along one axis, whose index depends only on the output's index there; else None."""
    if src.shape != tuple(in_shape) or (src < 0).any():
        return None
    got = np.unravel_index(src, in_shape)
    grid = np.indices(in_shape)
    moved = [a for a in range(len(in_shape)) if not np.array_equal(got[a], grid[a])]
    if len(moved) != 1:
        return None
    axis = moved[0]
    first = tuple(slice(None) if a == axis else slice(0, 1) for a in range(len(in_shape)))
    idx = got[axis][first]
    if not np.array_equal(np.broadcast_to(idx, src.shape), got[axis]):
        return None
    return axis, idx.reshape(-1)


@dataclass(frozen=True, slots=True, eq=False)
class MovementChain:
    """A ``chain`` of data-movement ops ending at ``node`` that, composed, is the identity (``indices`` None) or a
    gather of ``indices`` along ``axis``."""

    node: ir.Node
    chain: list[ir.Node]
    axis: int | None = None
    indices: np.ndarray | None = None


@dataclass(frozen=True, slots=True, eq=False)
class GatherBefore:
    """A channel Gather (``gather``, its constant ``indices``) feeding only ``node``; for a MatMul or Conv, its
    ``weight``."""

    node: ir.Node
    gather: ir.Node
    indices: np.ndarray
    weight: np.ndarray | None = None


@register_pass(group="collapse")
class CollapseDataMovement(Rule):
    """D₁ → … → Dₙ (data movement, n ≥ 2, one of them a Transpose) → nothing or one Gather(axis, indices).

    Algebra: the chain's element map is the composition of its ops' maps (:mod:`streamline.algebra`); when it takes
    every element from its own position, the chain is the identity; when it moves elements along one axis only, by
    an index depending on that axis alone (a channel shuffle: Reshape to [N, g, C/g, H, W], Transpose, Reshape back),
    it is that Gather. Conditions: every op has one data input and no fill; the intermediate tensors feed only the
    next op; static shapes."""

    op_types = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "DepthToSpace", "SpaceToDepth")

    def match(self, model: "Model", node: ir.Node) -> Any:
        if not is_standard_domain(node.domain):
            return None
        chain = _chain(node)
        if len(chain) < 2 or not any(n.op_type == "Transpose" for n in chain):
            return None
        uses = list(node.outputs[0].uses())
        if uses and all(u.node.op_type in self.op_types and len(_chain(u.node)) > len(chain) for u in uses):
            return None  # the longer chain ending further on is collapsed instead
        in_shape = static_shape(chain[0].inputs[0])
        if in_shape is None:
            return None
        composed = None
        for n in chain:
            emap = element_map_of(model, n)
            if emap is None:
                return self.miss(node, f"the {n.op_type}'s shapes are not static")
            src = emap.sources[0]
            composed = src if composed is None else np.where(src < 0, -1, composed.ravel()[np.maximum(src, 0)])
        found = single_axis_gather(composed, in_shape) if composed.shape == tuple(in_shape) else None
        if composed.shape == tuple(in_shape) and np.array_equal(composed.ravel(), np.arange(composed.size)):
            return MovementChain(node, chain)
        if found is None:
            return None
        return MovementChain(node, chain, *found)

    def rewrite(self, model: "Model", match: MovementChain) -> None:
        node, chain, axis, idx = match.node, match.chain, match.axis, match.indices
        x, y = chain[0].inputs[0], node.outputs[0]
        if idx is None:
            model.replace_uses(y, x)
        else:
            k = add_constant(model, idx.astype(np.int64), f"{node.name}_indices")
            out = model.make_value_like(y)
            if model.has_tensor_datatype(x.name):
                annotate(out, model.get_tensor_datatype(x.name))
            gather = ir.Node("", "Gather", [x, k], attributes=[ir.AttrInt64("axis", axis)], outputs=[out],
                             name=f"{node.name}_gather")
            model.graph.insert_after(node, gather)
            model.replace_uses(y, out)
        for n in reversed(chain):
            model.remove_node(n)


def _channel_gather(node: ir.Node, index: int = 0) -> tuple[ir.Node, np.ndarray] | None:
    """``(gather, indices)`` if input ``index`` of ``node`` is a Gather along axis 1 (channels) with constant 1-D
    indices feeding only ``node``."""
    v = node.inputs[index] if index < len(node.inputs) else None
    g = v.producer() if v is not None else None
    if g is None or g.op_type != "Gather" or not is_standard_domain(g.domain) or len(v.uses()) != 1 or \
            v.is_graph_output():
        return None
    idx = const_array(g.inputs[1])
    rank = len(g.inputs[0].shape) if g.inputs[0].shape is not None else None
    axis = int(g.attributes["axis"].value) if "axis" in g.attributes else 0
    if idx is None or idx.ndim != 1 or rank is None or axis % rank != 1:
        return None
    return g, idx.astype(np.int64)


def _is_permutation(idx: np.ndarray) -> bool:
    return np.array_equal(np.sort(idx), np.arange(idx.size))


@register_pass(group="reorder")
class MoveChannelGatherPastChannelwise(Rule):
    """op(Gather(x, π, axis=1)) → Gather(op'(x), π, axis=1) for an op that treats channels one by one: a depthwise
    Conv (its kernels reordered, ``W'[π[c]] = W[c]``), a pool or a reduction over other axes (unchanged).

    Algebra: output channel c of such an op depends on input channel c only, with its own parameters, so reordering
    the channels before it is reordering them after it, the parameters reordered inversely. Conditions: π is a
    permutation; the Gather feeds only the op; a depthwise Conv has constant weights and no bias input."""

    op_types = ("Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "ReduceSum", "ReduceMean",
                "ReduceMax", "ReduceMin")

    def match(self, model: "Model", node: ir.Node) -> Any:
        found = _channel_gather(node)
        if found is None or len(node.outputs) != 1 and node.outputs[1].uses():
            return None
        g, idx = found
        if not _is_permutation(idx):
            return self.miss(node, "the Gather's indices are not a permutation of the channels")
        mix = mixing(node)
        if mix is None or 1 in mix.mixed or 1 in mix.dropped:
            return None
        if node.op_type == "Conv":
            grp, cin, cout = mix.groups
            w = const_array(node.inputs[1])
            if not (grp == cin == cout) or w is None or (len(node.inputs) > 2 and node.inputs[2] is not None):
                return None
        return GatherBefore(node, g, idx)

    def rewrite(self, model: "Model", match: GatherBefore) -> None:
        node, g, idx = match.node, match.gather, match.indices
        node.replace_input_with(0, g.inputs[0])
        if node.op_type == "Conv":
            w = const_array(node.inputs[1])
            new_w = np.empty_like(w)
            new_w[idx] = w
            old = node.inputs[1]
            wv = add_constant(model, new_w, f"{old.name}_unshuffled",
                              model.get_tensor_datatype(old.name) if model.has_tensor_datatype(old.name) else None)
            node.replace_input_with(1, wv)
            model.drop_if_unused(old)
            reorder_channels(node, np.argsort(idx))  # the final check compares the kernels channel by channel
        y = node.outputs[0]
        out = model.make_value_like(y)
        model.replace_uses(y, out)
        if model.has_tensor_datatype(y.name):
            annotate(out, model.get_tensor_datatype(y.name))
        new = ir.Node("", "Gather", [y, g.inputs[1]], attributes=[ir.AttrInt64("axis", 1)], outputs=[out],
                      name=g.name)
        model.graph.insert_after(node, new)
        model.remove_node(g)


def _dense(w: np.ndarray, group: int) -> np.ndarray:
    """A grouped Conv weight ``[Cout, Cin/g, ...]`` as the dense ``[Cout, Cin, ...]`` one (zeros outside the
    groups)."""
    cout, cin_g = w.shape[:2]
    og = cout // group
    dense = np.zeros((cout, cin_g * group) + w.shape[2:], dtype=w.dtype)
    for k in range(group):
        dense[k * og:(k + 1) * og, k * cin_g:(k + 1) * cin_g] = w[k * og:(k + 1) * og]
    return dense


@register_pass(group="reorder")
class AbsorbChannelGatherIntoWeights(Rule):
    """Conv(Gather(x, idx, axis=1), W) → Conv(x, W'), MatMul(Gather(x, idx, axis=−1), W) → MatMul(x, W').

    Algebra: ``Σ_c W[o, c]·x[idx[c]] = Σ_j W'[o, j]·x[j]`` with ``W'[o, j] = Σ_{c : idx[c] = j} W[o, c]`` (a
    permutation reorders W's input channels; a selection or a repetition sums the columns it merges): exact on
    integer weights, which stay integers. A grouped Conv first becomes the dense Conv it is (zeros outside the
    groups): reordered channels no longer respect the groups; it lowers to the same block-sparse MatMul it would
    have anyway (LowerConvsToMatMul's dense_grouped). Conditions: the Gather feeds only the layer; constant weight;
    a depthwise Conv is not a channel-mixing layer (MoveChannelGatherPastChannelwise moves the Gather past it)."""

    op_types = ("Conv", "MatMul")

    def match(self, model: "Model", node: ir.Node) -> Any:
        v = node.inputs[0]
        g = v.producer() if v is not None else None
        if g is None or g.op_type != "Gather" or len(node.inputs) < 2:
            return None  # (first: reading a depthwise layer's weight would make its dense matrix)
        w = const_array(node.inputs[1])
        if w is None:
            return None
        if node.op_type == "MatMul":
            if len(v.uses()) != 1 or w.ndim != 2:
                return None
            idx = const_array(g.inputs[1])
            rank = len(g.inputs[0].shape) if g.inputs[0].shape is not None else None
            axis = int(g.attributes["axis"].value) if "axis" in g.attributes else 0
            if idx is None or idx.ndim != 1 or rank is None or axis % rank != rank - 1:
                return None
            return GatherBefore(node, g, idx.astype(np.int64), w)
        found = _channel_gather(node)
        if found is None or (len(node.inputs) > 2 and node.inputs[2] is not None):
            return None
        mix = mixing(node)
        if mix is None or mix.groups is None:
            return None
        grp, cin, cout = mix.groups
        if grp > 1 and grp == cin == cout:
            return None
        return GatherBefore(node, found[0], found[1], w)

    def rewrite(self, model: "Model", match: GatherBefore) -> None:
        node, g, idx, w = match.node, match.gather, match.indices, match.weight
        x_in = static_shape(g.inputs[0])
        if node.op_type == "MatMul":
            new_w = np.zeros((x_in[-1], w.shape[1]), dtype=np.float64)
            np.add.at(new_w, idx, w.astype(np.float64))
        else:
            group = int(node.attributes["group"].value) if "group" in node.attributes else 1
            dense = _dense(w, group).astype(np.float64) if group > 1 else w.astype(np.float64)
            new_w = np.zeros((dense.shape[0], x_in[1]) + dense.shape[2:], dtype=np.float64)
            np.add.at(new_w, (slice(None), idx), dense)
            if group > 1:
                node.attributes["group"] = ir.AttrInt64("group", 1)
        old = node.inputs[1]
        from streamline.datatypes import Range

        new_w = new_w.astype(np.float32)
        node.replace_input_with(1, add_constant(model, new_w, f"{old.name}_gathered", Range.of_array(new_w).datatype()
                                                if model.has_tensor_datatype(old.name) else None))
        model.drop_if_unused(old)
        node.replace_input_with(0, g.inputs[0])
        model.remove_node(g)
