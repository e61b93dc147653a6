"""What a rewrite touched, and running just that part of the graph.

Two versions of a model are compared node by node through *signatures*: op, domain, attributes, input and output
tensor names, and a fingerprint of the content of every initializer a node reads. A node of the new version whose
signature the old version lacks is *changed*; the changed nodes form the *region*. Everything else computes what it
computed before, on the same inputs, so only the region needs re-running: on the tensors it reads (cached values of
the old version) it must reproduce the tensors it hands to the unchanged rest of the graph (its *boundary*).

:func:`find_change` computes the region, its inputs and its boundary (and the structural problems a pass left);
:func:`run_nodes` builds a small model of some nodes and runs it with the oracle on each cached sample, optionally
feeding cached values in place of computed ones (teacher forcing); :func:`descendants`, :func:`ancestors` and
:func:`hull` grow a region; :class:`Snapshot` and :class:`Fingerprints` keep what the comparison needs.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from custom_ops.executor import Executor
from custom_ops.registry import make_op
from custom_ops.subgraph import as_constant, handed_over, model_of
from finnlite.core.clone import clone_model
from finnlite.core.model import Model
from finnlite.core.tensors import content_crc, is_immutable
from finnlite.core.traverse import ancestors, descendants, node_label, topo_order
from verify.cache import Recompute, SampleValues

__all__ = ["Fingerprints", "Snapshot", "Change", "find_change", "run_nodes", "hull", "structure_key",
           "node_signature"]


class Fingerprints:
    """Fingerprints of tensors (initializers, tensor attributes): equal fingerprints mean equal contents.

    A tensor read from a file (``TensorProtoTensor``), wrapping a frozen array
    (:func:`finnlite.core.model.freeze`: every initializer :meth:`Model.set_initializer` sets) or a compact depthwise weight cannot change without being
    replaced (:func:`finnlite.core.tensors.is_immutable`), so it is fingerprinted
    by identity, without reading its bytes: the versions of a model share such tensors, and a replaced one gets a
    new fingerprint (even when its contents are the same: its readers are then re-run, which costs time but never
    hides a change). The cache holds the tensors it fingerprinted, so that no identity is reused while a
    fingerprint is in use, until :meth:`retain` keeps only those of the current snapshot (which holds them itself).
    A tensor over a writable numpy array is hashed (crc32 of its bytes) again in each generation
    (:meth:`new_generation`, after each pass), so that an in-place edit is still seen."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[Any, tuple]] = {}
        self._volatile: dict[int, tuple[Any, tuple]] = {}

    def new_generation(self) -> None:
        """Forget the fingerprints of writable tensors (call it after anything may have edited them: a pass)."""
        self._volatile.clear()

    def retain(self, model: Model) -> None:
        """Forget the tensors ``model`` does not hold (its initializers and tensor attributes): once no snapshot
        holds a tensor, no signature refers to it, and keeping it would keep every replaced weight in memory.
        ``model`` must stay alive as long as the signatures computed from it are in use (a snapshot's model does)."""
        keep = {id(v.const_value) for v in model.graph.initializers.values() if v.const_value is not None}
        for node in model.graph:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR:
                    keep.add(id(attr.value))
                elif attr.type == ir.AttributeType.TENSORS:
                    keep.update(id(t) for t in attr.value)
        self._cache = {k: hit for k, hit in self._cache.items() if k in keep}

    def of(self, tensor: Any) -> tuple:
        """(dtype, shape, "object", identity) of an immutable ``onnx_ir`` tensor, (dtype, shape, crc32 of the
        bytes, size) of a writable one."""
        key = id(tensor)
        for cache in (self._cache, self._volatile):
            hit = cache.get(key)
            if hit is not None and hit[0] is tensor:
                return hit[1]
        if is_immutable(tensor):
            fp = (str(tensor.dtype), tuple(tensor.shape), "object", key)
            self._cache[key] = (tensor, fp)
            return fp
        arr = np.asarray(tensor.numpy())
        fp = (str(tensor.dtype), tuple(tensor.shape), content_crc(arr), arr.nbytes)
        self._volatile[key] = (tensor, fp)
        return fp

    def attribute(self, attr: ir.Attr) -> tuple:
        """A digest of one attribute's value (tensors by fingerprint, graphs by content)."""
        value = attr.value
        if attr.type in (ir.AttributeType.TENSOR,):
            return (attr.type, self.of(value))
        if attr.type in (ir.AttributeType.TENSORS,):
            return (attr.type, tuple(self.of(t) for t in value))
        if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
            graphs = value if isinstance(value, Sequence) else [value]
            h = hashlib.blake2b(digest_size=16)
            for g in graphs:
                h.update(ir.serde.serialize_graph(g).SerializeToString())
            return (attr.type, h.hexdigest())
        digest = (attr.type, tuple(value) if isinstance(value, (list, tuple)) else value)
        try:
            hash(digest)
        except TypeError:  # a value without a hash (a type proto, say): by its text
            return (attr.type, repr(value))
        return digest


def node_signature(node: ir.Node, fps: Fingerprints) -> tuple:
    """(domain, op type, overload, inputs (name, and content fingerprint for initializers), output names,
    attribute digests): two nodes with equal signatures compute the same thing."""
    ins = []
    for v in node.inputs:
        if v is None:
            ins.append(("",))
        elif v.is_initializer() and v.const_value is not None:
            ins.append((v.name, fps.of(v.const_value)))
        else:
            ins.append((v.name,))
    attrs = tuple(sorted([(k, fps.attribute(a)) for k, a in _items(node.attributes)]))
    return (node.domain or "", node.op_type, node.overload or "", tuple(ins), tuple(o.name for o in node.outputs),
            attrs)


def _items(mapping: Any) -> Any:
    """``mapping.items()``, through the plain dict of a ``UserDict`` (onnx_ir's attribute and initializer
    containers): its items view iterates in C, where the ``Mapping`` one runs a Python generator per item."""
    data = getattr(mapping, "data", None)
    return data.items() if isinstance(data, dict) else mapping.items()


def structure_key(model: Model) -> int:
    """A cheap key of the graph's state: node identities, op types, attribute objects, tensor names, initializer
    tensor objects. Equal keys mean nothing was rewired, replaced or renamed (an in-place edit of an initializer's
    array is not seen; the next check's fingerprints see it)."""
    parts: list[Any] = []
    for n in model.graph:  # list comprehensions: this runs after every pass, and generators cost twice as much
        attrs = n.attributes
        parts.append((id(n), n.op_type, n.domain,
                      tuple([(k, id(a), id(a.value)) for k, a in _items(attrs)]) if attrs else (),
                      tuple([v.name if v is not None else "" for v in n.inputs]),
                      tuple([o.name for o in n.outputs])))
    parts.append(tuple([(k, id(v), id(v.const_value)) for k, v in _items(model.graph.initializers)]))
    parts.append(tuple(v.name for v in model.graph.inputs) + tuple(v.name for v in model.graph.outputs))
    return hash(tuple(parts))


def _interface(model: Model) -> tuple:
    ins = tuple((v.name, str(v.dtype), model.get_tensor_shape(v.name)) for v in model.graph.inputs)
    return ins, tuple(v.name for v in model.graph.outputs)


@dataclass
class Snapshot:
    """A copy of one version of the model: a structural clone sharing the initializer tensors (O(nodes)), the
    multiset of node signatures, the interface (input names/types/shapes, output names) and the producer of each
    tensor (the clone does not change: a name it lacks needs no index rebuild, as ``Model.find_producer`` does)."""

    model: Model
    signatures: Counter
    interface: tuple
    producers: dict[str, ir.Node] = field(default_factory=dict)

    @classmethod
    def take(cls, model: Model, fps: Fingerprints, signatures: Counter | None = None, *,
             copy: bool = True) -> "Snapshot":
        """Snapshot ``model``; ``signatures``, if given, are its node signatures (computed by :func:`find_change`).
        ``copy=False``: ``model`` is a private copy already, which nothing else will change (it is kept as is)."""
        clone = clone_model(model) if copy else model
        if signatures is None:
            signatures = Counter(node_signature(n, fps) for n in clone.graph)
        producers = {o.name: n for n in clone.graph for o in n.outputs if o.name}
        return cls(clone, signatures, _interface(clone), producers)


@dataclass
class Change:
    """The region a pass changed: its nodes (topologically sorted), the tensors it reads from the unchanged part
    (``inputs``, values from the cache), the constants it reads (``constants``: names of initializers of the new
    version),
    the tensors it hands on to the unchanged part or the graph outputs (``boundary``), and the names the old version
    had that the new one lacks (``removed``). ``problems`` lists structural errors found on the way."""

    nodes: list[ir.Node] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    constants: list[str] = field(default_factory=list)
    boundary: list[str] = field(default_factory=list)
    removed: set[str] = field(default_factory=set)
    problems: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    #: the node signatures of the new version (to snapshot it without hashing again)
    signatures: Counter = field(default_factory=Counter)


def find_change(before: Snapshot, after: Model, fps: Fingerprints, cached: Iterable[str]) -> Change:
    """The region of ``after`` that differs from ``before``. ``cached`` are the tensor names whose values are known
    for the old version (every tensor of it, normally)."""
    change = Change()
    cached = set(cached)
    remaining = Counter(before.signatures)
    changed: list[ir.Node] = []
    after_nodes = list(after.graph)
    for node in after_nodes:
        sig = node_signature(node, fps)
        change.signatures[sig] += 1
        if remaining[sig] > 0:
            remaining[sig] -= 1
        else:
            changed.append(node)
    if _interface(after) != before.interface:
        old_in, old_out = before.interface
        new_in, new_out = _interface(after)
        what = f"outputs {list(old_out)} -> {list(new_out)}" if old_out != new_out else \
            f"inputs {list(old_in)} -> {list(new_in)}"
        change.problems.append((f"the pass changed the model's interface: {what}", None, None))
    try:
        change.nodes = topo_order(changed)
    except ValueError as exc:
        change.problems.append((f"the pass created a {exc}", None, None))
        change.nodes = changed
    region = {id(n) for n in change.nodes}
    produced = {o.name for n in change.nodes for o in n.outputs}
    inits = after.graph.initializers
    seen: set[str] = set()
    for node in change.nodes:
        for v in node.inputs:
            if v is None or v.name in produced or v.name in seen:
                continue
            seen.add(v.name)
            if v.name in inits and inits[v.name].const_value is not None:
                change.constants.append(v.name)
            elif v.name in cached and (_alive_producer(v, after) or v.is_graph_input()):
                change.inputs.append(v.name)
            else:
                change.problems.append(("the node reads a tensor that nothing produces", node_label(node), v.name))
    outputs = {v.name for v in after.graph.outputs}
    for node in change.nodes:
        for o in node.outputs:
            to_rest = any(id(u.node) not in region for u in o.uses())
            if to_rest or o.name in outputs:
                change.boundary.append(o.name)
                if o.name not in cached:
                    change.problems.append(("the pass created a tensor that unchanged nodes read, but the model "
                                            "before the pass had no such tensor", node_label(node), o.name))
    live = set(inits) | {v.name for v in after.graph.inputs} | {o.name for n in after_nodes for o in n.outputs}
    change.removed = {name for name in cached if name not in live}
    return change


def _alive_producer(v: ir.Value, model: Model) -> bool:
    prod = v.producer()
    return prod is not None and prod.graph is model.graph


def hull(model: Model, nodes: Sequence[ir.Node]) -> list[ir.Node]:
    """``nodes`` and every node on a path between two of them (topologically sorted): a region whose inputs do not
    depend on its own outputs."""
    ids = {id(n) for n in nodes}
    down, _ = descendants(model, [o.name for n in nodes for o in n.outputs])
    up = ancestors(nodes)
    return topo_order([n for n in model.graph if id(n) in ids or (id(n) in down and id(n) in up)])


def run_nodes(after: Model, nodes: Sequence[ir.Node], samples: Sequence[Mapping[str, np.ndarray]],
              forced: set[str], constants: set[str], dtype: Any = np.float32) -> list[dict[str, np.ndarray]]:
    """Run ``nodes`` of ``after`` on each cached sample: the tensors they read but do not produce, and the
    ``forced`` tensors (teacher forcing: the nodes reading them get the cached value instead of the computed one),
    come from the sample's values; initializers and other ``constants`` become initializers. Returns, per sample,
    every tensor the run computed (for a forced tensor, the computed value) and the ones it read, as a
    :class:`~verify.cache.SampleValues`, in which every ``Im2Col``'s windows are a recomputation from its input,
    made when read (whether the run made them, or skipped them because the MatMul reading them ran as one Conv).
    ``dtype``: the executor's float type (float64 runs every float tensor in double precision)."""

    if not nodes:
        return [SampleValues() for _ in samples]
    produced = {o.name for n in nodes for o in n.outputs if o.name}
    protos = []
    for n in nodes:
        proto = ir.serde.serialize_node(n)
        for i, name in enumerate(proto.output):
            if name in forced:
                proto.output[i] = f"{name}__recomputed"
        protos.append(proto)
    inits = after.graph.initializers
    reads: list[str] = []
    for n in nodes:
        for v in n.inputs:
            if v is not None and v.name and (v.name not in produced or v.name in forced) and v.name not in reads:
                reads.append(v.name)
    const_values: dict[str, np.ndarray] = {}
    feeds0: dict[str, np.ndarray] = {}
    big: dict[str, Any] = {}
    for name in reads:
        init = inits.get(name)
        if init is not None and init.const_value is not None and name not in forced:
            tensor = init.const_value
            if handed_over(tensor):
                big[name] = as_constant(tensor)
            else:
                const_values[name] = tensor.numpy()
        elif name in constants and name not in forced:
            const_values[name] = samples[0][name]
        else:
            feeds0[name] = samples[0][name]
    model = model_of(protos, feeds0, const_values, after.graph.opset_imports)
    ex = Executor(model, dtype=dtype, constants=big)
    windows = [(p, make_op(p)) for p in protos if p.op_type == "Im2Col" and p.domain and p.input and p.output]
    results = []
    for values in samples:
        out = SampleValues(ex.run({name: values[name] for name in feeds0}, return_all=True, windows=False))
        for p, op in windows:  # kept as recomputations from their input, made if read (verify.cache)
            if p.input[0] not in out:
                continue
            x = out[p.input[0]]
            computed = dict.get(out, p.output[0])
            if isinstance(computed, np.ndarray):  # the run made it (no Conv read it): the cache need not keep it
                shape, dt = computed.shape, computed.dtype
            else:  # not computed: the MatMul reading it ran as a Conv
                shape, dt = ex.static_shape(p.output[0]), x.dtype
                if shape is None:
                    shape = tuple(op.infer_shapes([x.shape], [None])[0])
            dict.__setitem__(out, p.output[0], Recompute(op, [x], shape, dt))
        for name in forced & produced:  # report what the nodes computed, not what was fed
            if f"{name}__recomputed" in out:
                dict.__setitem__(out, name, dict.pop(out, f"{name}__recomputed"))
        results.append(out)
    return results
