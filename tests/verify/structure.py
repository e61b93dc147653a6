"""Structural checks of a graph (with networkx) and datatype consistency on reference data.

:func:`check_structure` finds, by tensor name (so that it works on an ``onnx.ModelProto`` that onnx_ir refuses to
load, e.g. one with a tensor produced twice, as well as on a :class:`finnlite.Model` a rewrite left broken):

* ``cycle`` — the graph has a cycle (the nodes on it are named);
* ``multiple_producers`` — a tensor is produced by more than one node (or is also a graph input or initializer);
* ``unsorted`` — a node reads a tensor produced by a later node (the nodes are not topologically sorted);
* ``dangling_input`` — a node reads a tensor that nothing produces; ``unproduced_output`` — likewise a graph output;
* ``unreachable`` — a node that no graph input reaches (``constant`` when it only computes a constant: allowed
  with ``allow_constants=True``, as in a QONNX export whose weight quantizers read initializers);
* ``dead`` — a node from which no graph output can be reached;
* ``dangling_initializer`` — an initializer that no node reads and that is not a graph output.

:func:`check_datatypes` runs the model on reference inputs and reports every tensor annotated with an integer
datatype that holds a value outside it (``datatype``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import networkx as nx
import numpy as np
import onnx

from custom_ops.executor import Executor
from finnlite.core.datatypes import is_integer_type
from finnlite.core.errors import GraphError
from finnlite.core.model import Model
from verify.compare import fits_datatype
from verify.reference import ReferenceData

__all__ = ["Issue", "StructureReport", "check_structure", "check_datatypes", "KINDS"]

KINDS = ("cycle", "multiple_producers", "unsorted", "dangling_input", "unproduced_output", "unreachable", "constant",
         "dead", "dangling_initializer", "datatype")


@dataclass(frozen=True)
class Issue:
    """One structural or datatype problem: its kind (see :data:`KINDS`), a message, the node and tensor."""

    kind: str
    message: str
    node: str | None = None
    tensor: str | None = None

    def describe(self) -> str:
        where = ", ".join(x for x in (f"node '{self.node}'" if self.node else "",
                                      f"tensor '{self.tensor}'" if self.tensor else "") if x)
        return f"[{self.kind}] {where + ': ' if where else ''}{self.message}"


@dataclass
class StructureReport:
    """The issues found; ``ok`` when there are none."""

    issues: list[Issue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.issues

    def kinds(self) -> set[str]:
        """The kinds of issue present."""
        return {i.kind for i in self.issues}

    def of_kind(self, kind: str) -> list[Issue]:
        return [i for i in self.issues if i.kind == kind]

    def text(self) -> str:
        return "\n".join(i.describe() for i in self.issues) if self.issues else "no structural issues"

    def raise_if_any(self) -> None:
        """Raise :class:`GraphError` for the first issue (the message counts the others)."""
        if self.issues:
            first = self.issues[0]
            more = f" (and {len(self.issues) - 1} more issue(s))" if len(self.issues) > 1 else ""
            raise GraphError(f"{first.kind}: {first.message}{more}", node=first.node, tensor=first.tensor)


@dataclass
class _Graph:
    labels: list[str]
    ops: list[str]
    inputs: list[list[str]]
    outputs: list[list[str]]
    graph_inputs: list[str]
    graph_outputs: list[str]
    initializers: list[str]


def _view(model: Any) -> _Graph:
    if isinstance(model, onnx.ModelProto):
        g = model.graph
        inits = [t.name for t in g.initializer]
        return _Graph([n.name or f"{n.op_type}#{i}" for i, n in enumerate(g.node)], [n.op_type for n in g.node],
                      [[x for x in n.input if x] for n in g.node], [[x for x in n.output if x] for n in g.node],
                      [v.name for v in g.input if v.name not in inits], [v.name for v in g.output], inits)
    if not isinstance(model, Model):
        model = Model(model, check=False)
    nodes = list(model.graph)
    return _Graph([n.name or f"{n.op_type}#{i}" for i, n in enumerate(nodes)], [n.op_type for n in nodes],
                  [[v.name for v in n.inputs if v is not None and v.name] for n in nodes],
                  [[v.name for v in n.outputs if v.name] for n in nodes],
                  [v.name for v in model.graph.inputs], [v.name for v in model.graph.outputs],
                  list(model.graph.initializers))


def check_structure(model: Any, *, allow_constants: bool = False) -> StructureReport:
    """Check a :class:`finnlite.Model`, an ``onnx.ModelProto`` or anything :class:`Model` loads (module
    docstring)."""
    g = _view(model)
    report = StructureReport()
    add = report.issues.append
    producers: dict[str, list[int]] = {}
    for i, outs in enumerate(g.outputs):
        for t in outs:
            producers.setdefault(t, []).append(i)
    sources = set(g.graph_inputs) | set(g.initializers)
    for t, ps in producers.items():
        extra = int(t in g.graph_inputs) + int(t in g.initializers)
        if len(ps) + extra > 1:
            what = ", ".join(f"'{g.labels[p]}'" for p in ps)
            also = " and a graph input" if t in g.graph_inputs else " and an initializer" if t in g.initializers else ""
            add(Issue("multiple_producers", f"produced by {what}{also}", g.labels[ps[-1]], t))
    for i, ins in enumerate(g.inputs):
        for t in ins:
            if t not in producers and t not in sources:
                add(Issue("dangling_input", "the node reads a tensor that nothing produces", g.labels[i], t))
    for t in g.graph_outputs:
        if t not in producers and t not in sources:
            add(Issue("unproduced_output", "graph output that nothing produces", None, t))

    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(g.labels)))
    for i, ins in enumerate(g.inputs):
        for t in ins:
            for p in producers.get(t, []):
                dag.add_edge(p, i, tensor=t)
    acyclic = nx.is_directed_acyclic_graph(dag)
    if not acyclic:
        cycle = nx.find_cycle(dag)
        names = [g.labels[u] for u, _ in cycle]
        add(Issue("cycle", "the graph has a cycle through " + " -> ".join(f"'{n}'" for n in names + names[:1]),
                  names[0], dag.edges[cycle[0]]["tensor"]))
    else:
        for i, ins in enumerate(g.inputs):
            late = [(t, p) for t in ins for p in producers.get(t, []) if p > i]
            if late:
                t, p = late[0]
                add(Issue("unsorted", f"reads '{t}', produced later by '{g.labels[p]}' (nodes are not "
                                      "topologically sorted)", g.labels[i], t))

    from_inputs = {i for i, ins in enumerate(g.inputs) if set(ins) & set(g.graph_inputs)}
    reached = set(from_inputs)
    for i in from_inputs:
        reached |= nx.descendants(dag, i)
    const = _constant_nodes(g, producers, dag, acyclic)
    for i, label in enumerate(g.labels):
        if i in reached:
            continue
        if i in const:
            if not allow_constants:
                add(Issue("constant", f"{g.ops[i]} only reads constants (it should have been folded)", label))
        else:
            add(Issue("unreachable", f"{g.ops[i]} is not reachable from any graph input", label))
    wanted = {p for t in g.graph_outputs for p in producers.get(t, [])}
    alive = set(wanted)
    for i in wanted:
        alive |= nx.ancestors(dag, i)
    for i, label in enumerate(g.labels):
        if i not in alive:
            add(Issue("dead", f"{g.ops[i]} does not contribute to any graph output", label))
    read = {t for ins in g.inputs for t in ins} | set(g.graph_outputs)
    for t in g.initializers:
        if t not in read:
            add(Issue("dangling_initializer", "initializer that no node reads", None, t))
    return report


def _constant_nodes(g: _Graph, producers: dict[str, list[int]], dag: nx.DiGraph, acyclic: bool) -> set[int]:
    if not acyclic:
        return set()
    const_tensors = set(g.initializers)
    const: set[int] = set()
    for i in nx.topological_sort(dag):
        if g.ops[i].startswith("Random"):
            continue
        if all(t in const_tensors for t in g.inputs[i]):
            const.add(i)
            const_tensors.update(g.outputs[i])
    return const



def check_datatypes(model: Any, inputs: Any, *, samples: int | None = 4) -> StructureReport:
    """Run ``model`` on reference inputs and report every integer-annotated tensor holding a value outside its
    datatype. ``inputs``: a :class:`verify.ReferenceData` (its first ``samples`` samples are used) or a dict of
    input arrays."""

    m = model if isinstance(model, Model) else Model(model, check=False)
    annotated = [(v.name, m.get_tensor_datatype(v.name)) for v in _values(m)
                 if m.has_tensor_datatype(v.name) and is_integer_type(m.get_tensor_datatype(v.name))]
    report = StructureReport()
    if not annotated:
        return report
    if isinstance(inputs, ReferenceData):
        feeds = [inputs.sample(i) for i in range(min(samples or inputs.num_samples, inputs.num_samples))]
    else:
        feeds = [dict(inputs)]
    ex = Executor(m.to_proto())
    bad: dict[str, tuple[int, int, float]] = {}
    for feed in feeds:
        values = ex.run(feed, return_all=True)
        for name, dt in annotated:
            if name not in values:
                continue
            arr = np.asarray(values[name])
            ok = fits_datatype(arr, dt)
            if not ok.all():
                first = float(arr.reshape(-1)[int(np.argmin(ok.reshape(-1)))])
                n, total, example = bad.get(name, (0, 0, first))
                bad[name] = (n + int((~ok).sum()), total + ok.size, example)
    for name, dt in annotated:
        if name in bad:
            n, total, example = bad[name]
            prod = m.find_producer(name)
            report.issues.append(Issue(
                "datatype", f"annotated {dt.name} but holds {n} of {total} values outside it on the reference data "
                            f"(e.g. {example!r}; {dt.name} is [{dt.min():g}, {dt.max():g}])",
                (prod.name or prod.op_type) if prod is not None else None, name))
    return report


def _values(model: Model) -> Iterable[Any]:
    yield from model.graph.inputs
    yield from model.graph.initializers.values()
    for node in model.graph:
        yield from node.outputs
