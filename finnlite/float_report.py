"""The integer-only report: which nodes still compute in float after streamlining, and why.

A tensor is *float* when it is not a constant and carries no integer datatype annotation; a node is a *float node*
when it produces a float tensor, except for

* the *input layer*: between a float graph input and the first quantizer, data-movement ops (Reshape, Transpose,
  Im2Col, ...) and the linear layer that reads the input (MatMul, Conv, Gemm, pooling) — a model whose input is
  float computes its first layer in float; these are listed separately (element-wise Mul/Add there are not: they
  belong in the first MultiThreshold);
* the *output dequantization*: the constant Mul/Div/Add/Sub and shape ops between the last integer tensor and a
  graph output (see :func:`verify.final.integer_tail`), listed separately;
* nodes that only read constants (the structural check reports those).

For each float node the report gives the rules that tried it and failed, from the pass manager's
:class:`~finnlite.core.passes.RunReport` ``misses`` (each a :class:`~finnlite.core.passes.Miss`: rule, node, failed
condition): the *closest* is the last one recorded for the node (the attempt that saw the final graph), unless the
misses carry a ``progress`` attribute (how many of its conditions the rule got through), which then decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from finnlite.channel_scales import channel_scale_cause
from finnlite.core.datatypes import is_integer_type
from finnlite.core.model import Model, as_model
from finnlite.core.passes import Miss
from finnlite.core.traverse import constant_tensors, node_label, topo_order
from finnlite.float_gate import float_gate_cause
from finnlite.grid_cause import grid_cause
from verify.final import integer_tail

__all__ = ["FloatNode", "FloatReport", "float_report"]

#: ops that move data without arithmetic (allowed on the float input before the first quantizer)
DATA_MOVEMENT = ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Slice", "Gather",
                 "Concat", "Split", "Expand", "Pad", "Im2Col")
#: pooling, allowed on the float input and on the input layer's output
_POOLS = ("MaxPool", "MaxPoolNHWC", "AveragePool", "GlobalAveragePool")
#: the linear layer that may read a float input (the input layer)
INPUT_LAYER = ("MatMul", "Conv", "Gemm") + _POOLS


@dataclass
class FloatNode:
    """A node that still computes in float: its float outputs and inputs, why it counts as float, the closest
    rule's failed condition and every miss recorded for it."""

    name: str
    op_type: str
    float_outputs: list[str]
    float_inputs: list[str]
    reason: str
    closest: Miss | None = None
    misses: list[Miss] = field(default_factory=list)
    #: why no rule can make it integer, and what the user can change (:mod:`finnlite.channel_scales`), or ""
    cause: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "op_type": self.op_type, "float_outputs": self.float_outputs,
                "float_inputs": self.float_inputs, "reason": self.reason, "cause": self.cause,
                "closest": None if self.closest is None else {"rule": self.closest.rule, "reason": self.closest.reason},
                "misses": [{"rule": m.rule, "reason": m.reason} for m in self.misses]}

    def text(self) -> str:
        line = f"{self.op_type} '{self.name}': {self.reason}"
        if self.cause:
            line += f"; {self.cause}"
        if self.closest is None:
            return line if self.cause else line + "; no rule tried it"
        line += f"; closest rule {self.closest.rule}: {self.closest.reason}"
        others = [m for m in self.misses if m.rule != self.closest.rule]
        if others:
            line += "; also " + "; ".join(f"{m.rule}: {m.reason}" for m in others)
        return line


@dataclass
class FloatReport:
    """The float nodes left (in graph order) and the output dequantization nodes (allowed)."""

    nodes: list[FloatNode] = field(default_factory=list)
    dequantization: list[str] = field(default_factory=list)
    input_layer: list[str] = field(default_factory=list)

    @property
    def integer_only(self) -> bool:
        """True if no float node is left."""
        return not self.nodes

    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def to_dict(self) -> dict[str, Any]:
        return {"integer_only": self.integer_only, "float_nodes": [n.to_dict() for n in self.nodes],
                "input_layer": list(self.input_layer), "dequantization": list(self.dequantization)}

    def text(self) -> str:
        if not self.nodes:
            lines = ["integer-only: no float node is left"]
        else:
            lines = [f"{len(self.nodes)} float node(s) left:"] + [f"  {n.text()}" for n in self.nodes]
        if self.input_layer:
            lines.append("input layer on the float input (allowed): " + ", ".join(self.input_layer))
        if self.dequantization:
            lines.append("output dequantization (float, allowed): " + ", ".join(self.dequantization))
        return "\n".join(lines)

    __str__ = text


def _closest(misses: list[Miss]) -> Miss | None:
    if not misses:
        return None
    if any(hasattr(m, "progress") for m in misses):
        return max(reversed(misses), key=lambda m: getattr(m, "progress", -1))
    return misses[-1]


def _dedupe(misses: Iterable[Miss]) -> list[Miss]:
    """One miss per rule (its last), in the order of their last occurrence."""
    last: dict[str, Miss] = {}
    for m in misses:
        last.pop(m.rule, None)
        last[m.rule] = m
    return list(last.values())


def float_report(model: Any, misses: Iterable[Miss] | Any = ()) -> FloatReport:
    """The integer-only report of ``model`` (module docstring). ``misses``: the ``misses`` of a
    :class:`~finnlite.core.passes.RunReport`, or the RunReport itself."""
    m: Model = as_model(model)
    misses = list(getattr(misses, "misses", misses))
    const = constant_tensors(m)
    inputs = {v.name for v in m.graph.inputs}

    def is_float(name: str) -> bool:
        return name not in const and not (m.has_tensor_datatype(name) and is_integer_type(m.get_tensor_datatype(name)))

    tail_nodes: set[int] = set()
    dequant: list[str] = []
    for out in m.output_names:
        found = integer_tail(m, out)
        if found is not None:
            for n in found[1]:
                if id(n) not in tail_nodes:
                    tail_nodes.add(id(n))
                    dequant.append(f"{n.op_type} '{node_label(n)}'")
    head: set[str] = {name for name in inputs if is_float(name)}  # the float input, moved around
    layer: set[str] = set()  # the output of the input layer, moved around
    by_node: dict[str, list[Miss]] = {}
    for miss in misses:
        by_node.setdefault(miss.node, []).append(miss)
    report = FloatReport(dequantization=dequant)
    root: dict[str, FloatNode] = {}  # float tensor -> the float node its floatness starts at
    for node in topo_order(list(m.graph)):
        data_in = [v.name for v in node.inputs if v is not None and v.name not in const]
        if not data_in or id(node) in tail_nodes:
            continue
        if all(n in head or n in layer for n in data_in) and (
                node.op_type in DATA_MOVEMENT + _POOLS or (node.op_type in INPUT_LAYER and all(n in head
                                                                                             for n in data_in))):
            # data movement and pooling keep the input (or the first layer's output); one linear layer may read it
            into = head if node.op_type not in INPUT_LAYER and all(n in head for n in data_in) else layer
            into.update(o.name for o in node.outputs if is_float(o.name))
            if node.op_type in INPUT_LAYER:
                report.input_layer.append(f"{node.op_type} '{node_label(node)}'")
            continue
        float_out = [o.name for o in node.outputs if o.name and is_float(o.name)]
        if not float_out:
            continue
        label = node_label(node)
        found = _dedupe(by_node.get(label, []) + (by_node.get(node.op_type, []) if not node.name else []))
        float_in = [n for n in data_in if is_float(n)]
        reason = f"output '{float_out[0]}' has no integer datatype"
        if float_in:
            reason += f" (float input '{float_in[0]}')"
        cause = ("" if float_in else channel_scale_cause(node) or float_gate_cause(node) or "") or grid_cause(m, node) \
            or ""
        entry = FloatNode(label, node.op_type, float_out, float_in, reason, _closest(found), found, cause)
        origin = root.get(float_in[0], entry) if float_in else entry
        if origin is not entry and origin.cause:
            entry.reason += f", float because of {origin.op_type} '{origin.name}' above"
        root.update((name, origin) for name in float_out)
        report.nodes.append(entry)
    return report
