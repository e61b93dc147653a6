"""Joins of differently scaled integer branches that only thresholds read: integer multipliers, proven exact.

:class:`IntegerJoinMultipliers` replaces the two float scales of a residual Add by a pair of small integers
(:mod:`streamline.join_search` finds them and proves them by enumeration over the branches' finite ranges) when
every consumer of the Add is a MultiThreshold. Every chosen pair is logged with its bit widths; where no pair fits
the limit, the rule's miss says why and the join stays float.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import onnx_ir as ir

from finnlite.core.datatypes import is_integer_type
from finnlite.core.passes import Rule, register_pass
from streamline.absorb import materialize, real_thresholds_of
from streamline.exact import const_operand, exact_value
from streamline.join_search import JoinMultipliers, find_multipliers
from streamline.real_thresholds import RealThresholds, set_real_thresholds

log = logging.getLogger(__name__)
_STD = ("", "ai.onnx")
#: (scales, ranges, consumers' thresholds, limit) -> the search's result; a miss is searched once, not per round
_CACHE: dict[tuple, JoinMultipliers | str] = {}


@dataclass(frozen=True, slots=True, eq=False)
class Branch:
    """One input of a join: a scalar ``Mul(source, scale)`` (``mul``) feeding only the Add, or the input itself
    (``mul`` None, scale 1); ``source`` is an integer tensor whose datatype's ``(min, max)`` is ``bounds``."""

    source: ir.Value
    scale: Fraction
    mul: ir.Node | None
    bounds: tuple[int, int]


@dataclass(frozen=True, slots=True, eq=False)
class JoinMatch:
    """A join ``node`` of two integer ``branches`` read only by MultiThresholds (``consumers``), and the integer
    multipliers and thresholds ``found`` for them."""

    node: ir.Node
    branches: tuple[Branch, Branch]
    consumers: list[ir.Node]
    found: JoinMultipliers


def _branch(model: Any, node: ir.Node, i: int) -> Branch | str | None:
    """The :class:`Branch` at input ``i`` of the Add; None if its source is not an integer tensor; a string if its
    scale is not a scalar."""
    v = node.inputs[i]
    lin = v.producer()
    src, scale, mul = v, Fraction(1), None
    if lin is not None and lin.op_type == "Mul" and lin.domain in _STD and len(v.uses()) == 1:
        c = const_operand(lin)
        if c is not None:
            val = exact_value(lin, c[1])
            if val.size != 1:
                return "a branch's scale is not a scalar"
            src, scale, mul = lin.inputs[1 - c[0]], Fraction(val.ravel()[0]), lin
    dt = model.get_tensor_datatype(src.name) if src.name else None
    if dt is None or not is_integer_type(dt):
        return None
    return Branch(src, scale, mul, (int(dt.min()), int(dt.max())))


@register_pass(group="reorder")
class IntegerJoinMultipliers(Rule):
    """Add(Mul(a, s1), Mul(b, s2)) → MultiThreshold(·, R) [one or more]
    ⇒ Add(Mul(a, p), Mul(b, q)) → MultiThreshold(·, T') with integers p, q and integer thresholds T'.

    Conditions: a and b are integer tensors (their datatypes bound the box), s1 ≠ s2 scalars not both integers (a
    branch without a Mul has scale 1), the Muls feed only the Add, and every consumer of the Add is a
    MultiThreshold (a fork of thresholds shares one pair). Algebra: on the finite box, for every threshold of every
    consumer, ``p·a + q·b ≥ T' ⇔ s1·a + s2·b ≥ R`` (``>`` where strict), proven by enumeration with exact
    arithmetic (:mod:`streamline.join_search`); the smallest such pair with ``|p|, |q| ≤ max_multiplier`` is
    taken (at most the exact ratio's integers, which always qualify); negative scales give negative multipliers.
    The multipliers stay Mul nodes, the form FINN takes (integer ElementwiseMul layers; a MultiThreshold that
    absorbed k, out_scale k, is refused by step_convert_to_hw, and k-fold repeated thresholds would cost k times
    their memory). A multiplier −1 makes the join a Sub (FINN would type a Mul by −1 as BIPOLAR)."""

    op_types = ("Add",)
    #: the largest multiplier magnitude (16-bit signed integers)
    max_multiplier = 2**15 - 1

    def match(self, model: Any, node: ir.Node) -> Any:
        if len(node.inputs) != 2 or const_operand(node) is not None or any(v is None for v in node.inputs):
            return None
        found_branches = [_branch(model, node, i) for i in (0, 1)]
        if any(b is None for b in found_branches):
            return None
        for b in found_branches:
            if isinstance(b, str):
                return self.miss(node, b)
        left, right = found_branches
        s1, s2, ra, rb = left.scale, right.scale, left.bounds, right.bounds
        if (left.mul is None and right.mul is None) or s1 == s2 or (s1.denominator == 1 and s2.denominator == 1):
            return None  # no scale, equal scales (MoveLinearPastEltwiseAdd) or integer arithmetic already
        y = node.outputs[0]
        if y.is_graph_output():
            return self.miss(node, "the join's result is a graph output (not read by thresholds only)")
        uses = list(y.uses())
        others = sorted({u.node.op_type for u in uses if u.node.op_type != "MultiThreshold" or u.idx != 0})
        if others:
            return self.miss(node, f"the join's result feeds {', '.join(others)}, not only thresholds")
        consumers = [u.node for u in uses]
        rts = [real_thresholds_of(model, mt) for mt in consumers]
        key = (s1, s2, ra, rb, tuple(rt.to_json() for rt in rts), self.max_multiplier)
        found = _CACHE.get(key)
        if found is None:
            found = find_multipliers(rts, s1, s2, ra, rb, self.max_multiplier)
            if len(_CACHE) > 256:
                _CACHE.clear()
            _CACHE[key] = found
        if isinstance(found, str):
            return self.miss(node, found)
        return JoinMatch(node, (left, right), consumers, found)

    def rewrite(self, model: Any, match: JoinMatch) -> None:
        node, consumers, found = match.node, match.consumers, match.found
        ks = (found.p, found.q)
        sub = ks.count(-1) == 1  # a lone multiplier −1 is a Sub's subtrahend (FINN types a Mul by −1 as BIPOLAR)
        terms = []
        for branch, k in zip(match.branches, ks):
            src = branch.source
            if k != 1 and not (sub and k == -1):
                c = model.add_initializer(np.array(float(k), np.float32), prefix=f"{node.name}_int")
                m = ir.Node("", "Mul", [src, c], outputs=[model.make_value_like(src)], name=f"{node.name}_x{k}")
                model.graph.insert_before(node, m)
                src = m.outputs[0]
            terms.append(src)
        if ks[0] == -1 and sub:
            terms.reverse()
        y = node.outputs[0]
        add = ir.Node("", "Sub" if sub else "Add", terms, outputs=[model.make_value_like(y)], name=f"{node.name}_int")
        model.graph.insert_before(node, add)
        model.replace_uses(y, add.outputs[0])
        model.remove_node(node)
        add.name = node.name
        for branch in match.branches:
            if branch.mul is not None:
                model.remove_node(branch.mul)
        for mt, t in zip(consumers, found.thresholds):
            set_real_thresholds(mt, RealThresholds(t, np.zeros(t.shape, dtype=bool)))
            materialize(model, mt)
        log.info("%s: %s: %s", self.name, node.name, found.describe())
