"""Walking a graph: a node's label for messages, a topological order of some nodes, the nodes before and after
others, and the tensors that depend on no graph input.

These read the graph and change nothing; the verifier (:mod:`verify`), the reports and the executor's callers
share them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

import onnx_ir as ir

if TYPE_CHECKING:
    from finnlite.core.model import Model

__all__ = ["node_label", "topo_order", "constant_tensors", "descendants", "ancestors"]


def node_label(node: ir.Node) -> str:
    """A node's name, or ``OpType(->first output)`` for an unnamed node."""
    if node.name:
        return node.name
    first = node.outputs[0].name if node.outputs else "?"
    return f"{node.op_type}(->{first})"


def topo_order(nodes: Sequence[ir.Node]) -> list[ir.Node]:
    """``nodes`` in a topological order of their mutual dependencies (stable); raises ValueError naming a node on
    a cycle."""
    ids = {id(n): i for i, n in enumerate(nodes)}
    indeg = [0] * len(nodes)
    succ: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        preds = {ids[id(p)] for v in n.inputs if v is not None and (p := v.producer()) is not None and id(p) in ids}
        for j in preds:
            succ[j].append(i)
        indeg[i] = len(preds)
    ready = [i for i in range(len(nodes)) if indeg[i] == 0]
    ready.reverse()
    out: list[int] = []
    while ready:
        i = ready.pop()
        out.append(i)
        for j in reversed(succ[i]):
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if len(out) != len(nodes):
        stuck = next(n for i, n in enumerate(nodes) if indeg[i] > 0)
        raise ValueError(f"cycle through node '{node_label(stuck)}'")
    return [nodes[i] for i in out]


def constant_tensors(model: Model) -> set[str]:
    """Names of the tensors that do not depend on any graph input: initializers and the outputs of nodes that read
    only constants."""
    const = set(model.graph.initializers)
    for node in topo_order(list(model.graph)):
        if node.op_type.startswith("Random"):
            continue
        if all(v is None or v.name in const for v in node.inputs):
            const.update(o.name for o in node.outputs)
    return const


def descendants(model: Model, tensors: Iterable[str]) -> tuple[set[int], set[str]]:
    """The nodes (by id) reading ``tensors`` directly or indirectly, and every tensor they produce."""
    nodes: set[int] = set()
    names: set[str] = set(tensors)
    work = [model.value(t) for t in names]
    while work:
        v = work.pop()
        if v is None:
            continue
        for use in v.uses():
            n = use.node
            if id(n) in nodes or n.graph is not model.graph:
                continue
            nodes.add(id(n))
            for o in n.outputs:
                names.add(o.name)
                work.append(o)
    return nodes, names


def ancestors(nodes: Iterable[ir.Node]) -> set[int]:
    """The nodes (by id) that ``nodes`` depend on, directly or indirectly (``nodes`` themselves excluded unless they
    depend on each other)."""
    seen: set[int] = set()
    work = list(nodes)
    while work:
        n = work.pop()
        for v in n.inputs:
            p = v.producer() if v is not None else None
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                work.append(p)
    return seen
