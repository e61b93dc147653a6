"""Structural proof of a pure layout pass: the model after it computes what the model before computed, up to the
permutation of each tensor's axes (NCHW → NHWC, Transposes moved, absorbed or cancelled).

A layout pass (:class:`streamline.layout.ConvertToNHWC`, FINN's ``AbsorbTransposeIntoMultiThreshold`` and
``AbsorbConsecutiveTransposes``; passes declaring ``pure_layout = True``) moves data and nothing else, so it can be
checked without running anything. Both versions are rewritten into one table of *canonical terms* (hash-consed: two
tensors with the same term compute the same values from the graph inputs). Every tensor gets a representation
``(term, perm)`` meaning ``tensor = canonical.transpose(perm)``, or ``(term, cols)`` for a 2-D tensor after a
flatten of a permuted one (``tensor = canonical[:, cols]``). The rules, each an identity of the op:

* a Transpose adds no term: ``(t, p)`` → ``(t, p∘q)``; an Identity passes its input's;
* elementwise ops (Add, Mul, Relu, Quant, ...) on operands of one permutation ``p``: the op on the canonical
  operands, constants transposed back by ``p⁻¹`` (or their features reordered by ``cols⁻¹``), result ``p``;
* MultiThreshold / QuantAvgPool2d: the ``data_layout`` names the channel axis of the physical tensor; the canonical
  term records the axis (layout) it is in the canonical tensor; per-feature threshold rows follow ``cols``;
* MaxPool (NCHW) and MaxPoolNHWC (MakeMaxPoolNHWC): one pooling term, recording which canonical axes are pooled as
  H and W, with the kernel, strides, pads and ceil_mode (defaults filled in; ``auto_pad`` VALID is pads 0);
* MatMul with a constant weight: a permutation that keeps the last axis last commutes; a feature order ``cols``
  becomes an order of the weight's rows (canonical ``W[cols⁻¹]``);
* a flatten (Flatten, or a Reshape to ``[N, F]``) of ``(t, p)`` with ``p[0] = 0`` is ``flatten(t)[:, cols]``;
* Concat and reductions: the axis (axes) map through ``p``;
* any other op reads its inputs physically: a permuted input stands for the term "``t`` transposed by ``p``".

Constants compare by content (after the canonical transposition), attributes by value. If every graph output has
the same physical term in both versions, the pass is **proved** (in real arithmetic: a MatMul whose weight rows
were permuted sums in another order, which float32 may round differently, as the sampling policy allows).
Otherwise the first node of the new version whose term the old version lacks is examined: if the old version has a node of the same name or output name, op type and
canonical inputs that differs only in a constant or an attribute (a threshold row moved to the wrong channel, a
Concat axis, a channel axis), the pass is **refuted** naming the node and what differs (a layout pass claims to
change no value; such a node computes other values from the same inputs); anything else (an op without a rule, a
missing shape) is **undecided**, and the caller falls back to sampling, saying why.

:func:`structural_outcome` wraps this for :class:`verify.hook.VerificationHook`: a proof also gives the new version's
cached values on the reference samples, as transposes of the old ones (nothing is executed).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from custom_ops.multithreshold import channel_axis_of
from finnlite.core.model import Model
from finnlite.core.shapes import const_array
from finnlite.core.tensors import DepthwiseWeight
from streamline.lower_common import identity, inverse
from verify.region import node_label, topo_order

log = logging.getLogger(__name__)

__all__ = ["LayoutProof", "prove_layout", "structural_outcome"]

Perm = tuple[int, ...]

_ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Pow", "Mod", "PRelu", "Where", "Equal", "Less",
    "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "BitShift", "Relu", "Neg", "Abs", "Clip",
    "Round", "Floor", "Ceil", "Sign", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "HardSigmoid",
    "HardSwish", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Not", "Cast", "Softplus", "Softsign", "IsNaN", "IsInf",
    "Quant", "IntQuant", "BipolarQuant", "Trunc"})
_REDUCE = frozenset({"ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean"})


@dataclass(frozen=True)
class Rep:
    """``tensor = canonical(term).transpose(perm)``, or ``canonical(term)[:, cols]`` when ``cols`` is set."""

    term: int
    perm: Perm
    cols: tuple[int, ...] | None = None

    @property
    def plain(self) -> bool:
        return self.cols is None and self.perm == identity(len(self.perm))


@dataclass
class LayoutProof:
    """The outcome: ``status`` is ``"proved"``, ``"refuted"`` or ``"undecided"``; ``message`` says why, ``node`` and
    ``tensor`` name where (refuted, undecided)."""

    status: str
    message: str
    node: str | None = None
    tensor: str | None = None
    #: (proved) every tensor of the new version: its representation; and of the old one, by term
    after: dict[str, Rep] = field(default_factory=dict)
    before: dict[int, tuple[str, Rep]] = field(default_factory=dict)

    @property
    def proved(self) -> bool:
        return self.status == "proved"


class _Const:
    """A constant input: its tensor, and its array made only when a rule needs the values."""

    def __init__(self, v: ir.Value) -> None:
        self.v = v
        self.tensor = v.const_value
        self._array: np.ndarray | None = None

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            self._array = np.asarray(const_array(self.v))
        return self._array

    @property
    def shape(self) -> tuple[int, ...]:
        if self.tensor is not None and self.tensor.shape is not None:
            return tuple(int(d) for d in self.tensor.shape)
        return self.array.shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


class _Terms:
    """The table of canonical terms both versions share, and the fingerprints of constants (by content; a tensor
    both versions share is fingerprinted once, a compact depthwise weight by its kernel)."""

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.arrays: dict[tuple, Any] = {}
        self._by_tensor: dict[int, tuple[Any, tuple]] = {}

    def term(self, key: Any) -> int:
        return self.ids.setdefault(key, len(self.ids))

    def const(self, c: "_Const | np.ndarray") -> tuple:
        if isinstance(c, _Const):
            t = c.tensor
            if t is not None and id(t) in self._by_tensor:
                return self._by_tensor[id(t)][1]
            if isinstance(t, DepthwiseWeight):
                key = ("c", "depthwise", t.kernel.dtype.str, tuple(t.kernel.shape),
                       hashlib.blake2b(np.ascontiguousarray(t.kernel).tobytes(), digest_size=16).hexdigest())
                self.arrays.setdefault(key, c)
            else:
                key = self._content(c.array)
            if t is not None:
                self._by_tensor[id(t)] = (t, key)
            return key
        return self._content(c)

    def _content(self, arr: np.ndarray) -> tuple:
        a = np.ascontiguousarray(arr)
        if a.size == 1:
            a = a.reshape(())
        key = ("c", a.dtype.str, a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest())
        self.arrays.setdefault(key, a)
        return key

    def array(self, key: tuple) -> np.ndarray | None:
        found = self.arrays.get(key)
        return found.array if isinstance(found, _Const) else found


def _attrs(node: ir.Node, skip: tuple[str, ...] = ()) -> tuple:
    out = []
    for name in sorted(node.attributes):
        if name in skip:
            continue
        value = node.attributes[name].value
        if isinstance(value, (list, tuple)):
            value = tuple(value)
        elif hasattr(value, "numpy"):
            value = _Terms().const(value.numpy())
        try:
            hash(value)
        except TypeError:
            value = repr(value)
        out.append((name, value))
    return tuple(out)


def _shape(v: ir.Value) -> tuple[int, ...] | None:
    if v.shape is None:
        return None
    dims = tuple(d if isinstance(d, int) else -1 for d in v.shape)
    return None if -1 in dims else dims


class _Undecided(Exception):
    def __init__(self, message: str, node: ir.Node | None = None) -> None:
        super().__init__(message)
        self.node = node


class _Canon:
    """The canonical terms of one version's tensors (module docstring)."""

    def __init__(self, model: Model, terms: _Terms) -> None:
        self.model, self.terms = model, terms
        self.reps: dict[str, Rep] = {}
        #: per node (by name of its first output): (node, op key parts) for the diagnosis
        self.parts: dict[str, tuple[ir.Node, tuple]] = {}
        for v in model.graph.inputs:
            shape = _shape(v)
            self.reps[v.name] = Rep(terms.term(("input", v.name)), identity(len(shape)) if shape else ())
        for node in topo_order(list(model.graph)):
            self.visit(node)

    # -- helpers -----------------------------------------------------------------------------------------------
    def phys(self, r: Rep) -> int:
        """The term of the physical tensor ``r`` describes."""
        if r.plain:
            return r.term
        if r.cols is not None:
            return self.terms.term(("cols", r.term, r.cols))
        return self.terms.term(("perm", r.term, r.perm))

    def inputs(self, node: ir.Node) -> list[tuple[str, Any]]:
        """Each input as ("none", None), ("c", _Const) or ("t", Rep)."""
        out: list[tuple[str, Any]] = []
        for v in node.inputs:
            if v is None:
                out.append(("none", None))
                continue
            if v.const_value is not None or const_array(v) is not None:
                out.append(("c", _Const(v)))
            elif v.name in self.reps:
                out.append(("t", self.reps[v.name]))
            else:
                raise _Undecided(f"node '{node_label(node)}' reads '{v.name}', which nothing computes before it", node)
        return out

    def emit(self, node: ir.Node, key: tuple, reps: list[Rep | None] | Rep) -> None:
        """Name the node's outputs ``term(key, k)`` with representation ``reps`` (one for all, or per output)."""
        for k, o in enumerate(node.outputs):
            r = reps[k] if isinstance(reps, list) else reps
            if r is None or not o.name:
                continue
            self.reps[o.name] = Rep(self.terms.term((key, k)), r.perm, r.cols)
        if node.outputs:
            self.parts[node.outputs[0].name] = (node, key)

    def generic(self, node: ir.Node, ins: list[tuple[str, Any]]) -> None:
        keys = tuple(("t", self.phys(x)) if kind == "t" else (self.terms.const(x) if kind == "c" else ("none",))
                     for kind, x in ins)
        key = ("op", node.domain or "", node.op_type, _attrs(node), keys)
        self.emit(node, key, [Rep(0, identity(len(o.shape)) if o.shape is not None else ()) for o in node.outputs])

    # -- the rules -----------------------------------------------------------------------------------------------
    def visit(self, node: ir.Node) -> None:
        if node.op_type == "Constant" and not (node.domain or ""):
            return  # read through const_array by its consumers
        ins = self.inputs(node)
        dyn = [x for kind, x in ins if kind == "t"]
        op = node.op_type
        if op in ("Transpose", "Identity") and not (node.domain or "") and len(dyn) == 1 and ins[0][0] == "t":
            r = ins[0][1]
            if op == "Identity":
                self.reps[node.outputs[0].name] = r
                return
            if r.cols is None:
                attr = node.attributes.get("perm")
                rank = len(r.perm) or (len(attr.value) if attr is not None else 0)
                p = r.perm or identity(rank)
                q = tuple(int(i) for i in attr.value) if attr is not None else tuple(range(rank - 1, -1, -1))
                if q and len(q) == len(p):
                    self.reps[node.outputs[0].name] = Rep(r.term, tuple(p[i] for i in q))
                    return
        if not dyn:
            self.generic(node, ins)
            return
        # the rules apply to plain operands too: both versions must name the same computation the same way
        rule = {"MultiThreshold": self.multithreshold, "QuantAvgPool2d": self.quantavgpool, "MatMul": self.matmul,
                "Flatten": self.flatten, "Reshape": self.flatten, "Concat": self.concat, "MaxPool": self.maxpool,
                "MaxPoolNHWC": self.maxpool}.get(op)
        if op in _ELEMENTWISE:
            rule = self.elementwise
        elif op in _REDUCE:
            rule = self.reduce
        if rule is None or not rule(node, ins):
            self.generic(node, ins)

    def elementwise(self, node: ir.Node, ins: list) -> bool:
        dyn = [x for kind, x in ins if kind == "t"]
        cols = dyn[0].cols
        if any(r.cols != cols for r in dyn):
            return False
        if cols is not None:
            order = np.argsort(cols)
            keys = []
            for kind, x in ins:
                if kind == "c":
                    if x.size == 1:
                        keys.append(self.terms.const(x))
                    elif x.size == len(cols) and x.shape[-1] == len(cols):
                        keys.append(self.terms.const(x.array.reshape(1, -1)[:, order]))
                    else:
                        return False
                else:
                    keys.append(("t", x.term) if kind == "t" else ("none",))
            self.emit(node, ("ew", node.domain or "", node.op_type, _attrs(node), tuple(keys)),
                      Rep(0, (0, 1), cols))
            return True
        p = dyn[0].perm
        rank = len(p)
        if any(r.perm != p for r in dyn) or not rank:
            return False
        inv = inverse(p)
        keys = []
        for kind, x in ins:
            if kind == "c":
                if x.ndim > rank:
                    return False
                full = x.array.reshape((1,) * (rank - x.ndim) + x.shape)
                keys.append(self.terms.const(full.transpose(inv)))
            else:
                keys.append(("t", x.term) if kind == "t" else ("none",))
        self.emit(node, ("ew", node.domain or "", node.op_type, _attrs(node), tuple(keys)), Rep(0, p))
        return True

    def multithreshold(self, node: ir.Node, ins: list) -> bool:
        if len(ins) < 2 or ins[0][0] != "t" or ins[1][0] != "c":
            return False
        r, thr = ins[0][1], ins[1][1]
        attrs = _attrs(node, ("data_layout",))
        if r.cols is not None:
            if thr.ndim != 2 or thr.shape[0] not in (1, len(r.cols)):
                return False
            rows = thr if thr.shape[0] == 1 else thr.array[np.argsort(r.cols)]
            self.emit(node, ("MultiThreshold", attrs, 1, ("t", r.term), self.terms.const(rows)),
                      Rep(0, (0, 1), r.cols))
            return True
        rank = len(r.perm)
        if not rank:
            return False
        layout = node.attributes.get("data_layout")
        axis = channel_axis_of(str(layout.value) if layout is not None else "", rank)
        self.emit(node, ("MultiThreshold", attrs, r.perm[axis], ("t", r.term), self.terms.const(thr)),
                  Rep(0, r.perm))
        return True

    def quantavgpool(self, node: ir.Node, ins: list) -> bool:
        r = ins[0][1] if ins and ins[0][0] == "t" else None
        if r is None or r.cols is not None or len(r.perm) != 4:
            return False
        layout = str(node.attributes["data_layout"].value) if "data_layout" in node.attributes else "NCHW"
        canonical = [""] * 4
        for i, letter in enumerate(layout):
            canonical[r.perm[i]] = letter
        self.emit(node, ("QuantAvgPool2d", _attrs(node, ("data_layout",)), "".join(canonical), ("t", r.term)),
                  Rep(0, r.perm))
        return True

    def maxpool(self, node: ir.Node, ins: list) -> bool:
        r = ins[0][1] if len(ins) == 1 and ins[0][0] == "t" else None
        if r is None or r.cols is not None or len(r.perm) != 4:
            return False
        get = lambda name, default: tuple(int(v) for v in node.attributes[name].value) if name in node.attributes \
            else default  # noqa: E731
        if node.op_type == "MaxPool":
            if (node.domain or "") or get("dilations", (1, 1)) != (1, 1):
                return False
            auto_pad = str(node.attributes["auto_pad"].value) if "auto_pad" in node.attributes else "NOTSET"
            if auto_pad not in ("NOTSET", "VALID", ""):
                return False
            layout, pads = "NCHW", (0, 0, 0, 0) if auto_pad == "VALID" else get("pads", (0, 0, 0, 0))
        else:
            layout, pads = "NHWC", get("pads", (0, 0, 0, 0))
        canonical = [""] * 4
        for i, letter in enumerate(layout):
            canonical[r.perm[i]] = letter
        ceil = int(node.attributes["ceil_mode"].value) if "ceil_mode" in node.attributes else 0
        key = ("MaxPool2d", get("kernel_shape", ()), get("strides", (1, 1)), pads, ceil, "".join(canonical),
               ("t", r.term))
        self.emit(node, key, [Rep(0, r.perm)] + [None] * (len(node.outputs) - 1))  # not the Indices output
        return True

    def matmul(self, node: ir.Node, ins: list) -> bool:
        if len(ins) != 2 or ins[0][0] != "t" or ins[1][0] != "c" or ins[1][1].ndim != 2:
            return False
        r, w = ins[0][1], ins[1][1]
        if r.cols is not None:
            if w.shape[0] != len(r.cols):
                return False
            self.emit(node, ("MatMul", ("t", r.term), self.terms.const(w.array[np.argsort(r.cols)])), Rep(0, (0, 1)))
            return True
        if len(r.perm) < 2 or r.perm[-1] != len(r.perm) - 1:
            return False
        self.emit(node, ("MatMul", ("t", r.term), self.terms.const(w)), Rep(0, r.perm))
        return True

    def flatten(self, node: ir.Node, ins: list) -> bool:
        """A flatten to ``[N, F]`` of ``(t, p)`` with ``p[0] = 0``: ``flatten(t)[:, cols]``."""
        r = ins[0][1] if ins and ins[0][0] == "t" else None
        phys, out = _shape(node.inputs[0]), _shape(node.outputs[0])
        if r is None or r.cols is not None or phys is None or out is None or len(r.perm) != len(phys):
            return False
        canon = [0] * len(phys)
        for i, d in enumerate(phys):
            canon[r.perm[i]] = d
        if node.op_type == "Flatten" and int(node.attributes["axis"].value if "axis" in node.attributes else 1) != 1:
            return False
        if len(out) != 2 or out[0] != canon[0] or (r.perm and r.perm[0] != 0) or len(canon) < 2:
            return False
        inner = [q - 1 for q in r.perm[1:]]
        cols = tuple(int(c) for c in np.arange(int(np.prod(canon[1:]))).reshape(canon[1:]).transpose(inner).ravel())
        rep = Rep(0, (0, 1), None if cols == tuple(range(len(cols))) else cols)
        self.emit(node, ("flatten2d", ("t", r.term)), rep)
        return True

    def concat(self, node: ir.Node, ins: list) -> bool:
        dyn = [x for kind, x in ins if kind == "t"]
        p = dyn[0].perm
        if any(r.perm != p or r.cols is not None for r in dyn) or not p:
            return False
        axis = int(node.attributes["axis"].value) % len(p)
        inv = inverse(p)
        keys = tuple(("t", x.term) if kind == "t" else self.terms.const(
            x.array.reshape((1,) * (len(p) - x.ndim) + x.shape).transpose(inv)) for kind, x in ins if kind != "none")
        self.emit(node, ("Concat", p[axis], keys), Rep(0, p))
        return True

    def reduce(self, node: ir.Node, ins: list) -> bool:
        r = ins[0][1] if ins and ins[0][0] == "t" else None
        if r is None or r.cols is not None or not r.perm:
            return False
        rank = len(r.perm)
        if "axes" in node.attributes:
            axes = [int(a) % rank for a in node.attributes["axes"].value]
        elif len(ins) > 1 and ins[1][0] == "c":
            axes = [int(a) % rank for a in np.asarray(ins[1][1].array).ravel()]
        elif len(ins) > 1 and ins[1][0] == "t":
            return False
        else:
            axes = []
        if not axes:
            if "noop_with_empty_axes" in node.attributes and int(node.attributes["noop_with_empty_axes"].value):
                return False
            axes = list(range(rank))
        keep = int(node.attributes["keepdims"].value) if "keepdims" in node.attributes else 1
        canonical = tuple(sorted(r.perm[a] for a in axes))
        if keep:
            out = r.perm
        else:
            kept = [a for a in r.perm if a not in canonical]
            order = sorted(kept)
            out = tuple(order.index(a) for a in kept)
        self.emit(node, ("reduce", node.op_type, _attrs(node, ("axes",)), canonical, ("t", r.term)), Rep(0, out))
        return True


def prove_layout(before: Model, after: Model) -> LayoutProof:
    """Prove that ``after`` computes what ``before`` computes up to the permutation of its tensors (module
    docstring); ``refuted`` names the node whose constants or attributes differ, ``undecided`` says why not."""
    terms = _Terms()
    try:
        old = _Canon(before, terms)
        new = _Canon(after, terms)
    except _Undecided as exc:
        return LayoutProof("undecided", str(exc), node_label(exc.node) if exc.node is not None else None)
    except (ValueError, KeyError, IndexError) as exc:
        return LayoutProof("undecided", f"cannot canonicalize: {exc}")
    outs_a, outs_b = [v.name for v in before.graph.outputs], [v.name for v in after.graph.outputs]
    if outs_a != outs_b or [v.name for v in before.graph.inputs] != [v.name for v in after.graph.inputs]:
        return LayoutProof("undecided", "the pass changed the model's interface")
    differ = [o for o in outs_b if o not in new.reps or o not in old.reps
              or new.phys(new.reps[o]) != old.phys(old.reps[o])]
    if not differ:
        by_term: dict[int, tuple[str, Rep]] = {}
        for name, r in old.reps.items():
            by_term.setdefault(r.term, (name, r))
        return LayoutProof("proved", f"the {len(outs_b)} output(s) are the same terms", after=dict(new.reps),
                           before=by_term)
    return _diagnose(before, after, old, new, terms, differ[0])


def _diagnose(before: Model, after: Model, old: _Canon, new: _Canon, terms: _Terms, output: str) -> LayoutProof:
    """The first node of ``after`` (topological order) computing a term ``before`` lacks, compared with its
    counterpart in ``before`` (same output name, else same node name)."""
    known = {r.term for r in old.reps.values()}
    old_by_name = {node.name: (node, key) for node, key in old.parts.values() if node.name}
    for node in topo_order(list(after.graph)):
        if not node.outputs or node.outputs[0].name not in new.parts:
            continue
        name = node.outputs[0].name
        if name in new.reps and new.reps[name].term in known:
            continue
        _, key = new.parts[name]
        twin = old.parts.get(name) or old_by_name.get(node.name)
        if twin is None:
            return LayoutProof("undecided", f"node '{node_label(node)}' ({node.op_type}) computes a tensor the "
                               "model before the pass has no counterpart of", node_label(node), name)
        old_node, old_key = twin
        why = _what_differs(key, old_key, terms)
        if why is None or old_node.op_type != node.op_type:
            return LayoutProof("undecided", f"node '{node_label(node)}' ({node.op_type}) is not recognizably the "
                               f"old '{node_label(old_node)}' ({old_node.op_type}) up to the permutation",
                               node_label(node), name)
        return LayoutProof("refuted", f"node '{node_label(node)}' ({node.op_type}) reads the same inputs as before "
                           f"the pass (up to the permutation) but {why}", node_label(node), name)
    return LayoutProof("undecided", f"graph output '{output}' differs, and no node of the new version could be "
                       "matched to the difference", None, output)


def _what_differs(key: tuple, old: tuple, terms: _Terms) -> str | None:
    """How two node keys of the same shape differ in constants or attributes only (None if they differ otherwise:
    another op, other computed inputs)."""
    if type(key) is not type(old) or not isinstance(key, tuple) or len(key) != len(old):
        return None
    found = None
    for i, (a, b) in enumerate(zip(key, old)):
        if a == b:
            continue
        if isinstance(a, tuple) and a and a[0] == "c" and isinstance(b, tuple) and b and b[0] == "c":
            why = _const_diff(terms.array(a), terms.array(b))
            if why is None:
                return None  # equal contents under other fingerprints: not a difference this can name
            found = found or why
        elif isinstance(a, tuple) and isinstance(b, tuple) and a and b and a[0] not in ("t", "c") \
                and b[0] not in ("t", "c"):
            inner = _what_differs(a, b, terms)
            if inner is None:
                return None
            found = found or inner
        elif isinstance(a, int) and isinstance(b, int) and i > 0:  # an axis recorded in the key
            found = found or f"acts on canonical axis {a} where the original acted on axis {b}"
        elif isinstance(a, (str, float)) and isinstance(b, (str, float)):
            found = found or f"has {a!r} where the original has {b!r} (in the original axis order)"
        else:
            return None
    return found


def _const_diff(a: np.ndarray | None, b: np.ndarray | None) -> str | None:
    if a is None or b is None or a.shape != b.shape:
        return (f"a constant of shape {None if a is None else a.shape} where the original's, permuted back, has shape "
                f"{None if b is None else b.shape}")
    bad = np.argwhere(a != b)
    if not len(bad):
        return None
    i = tuple(int(j) for j in bad[0])
    return (f"a constant differs from the original's (permuted back to the original axis order) in {len(bad)} of "
            f"{a.size} elements, first at {i}: {a[i]!r} where the original has {b[i]!r}")


# -- the hook's use -------------------------------------------------------------------------------------------------
def structural_outcome(verifier: Any, model: Model) -> tuple[Any, str]:
    """For :class:`verify.hook.VerificationHook`: prove ``model`` against the verifier's last version. Returns
    ``(outcome, how)``: a successful :class:`verify.verifier.CheckOutcome` whose results are the new tensors'
    values made by transposing the cached ones (proved), a failed one naming the node (refuted), or None (undecided:
    the caller samples) with ``how`` saying why."""
    from verify.region import find_change
    from verify.verifier import CheckOutcome

    proof = prove_layout(verifier.snapshot.model, model)
    if proof.status == "refuted":
        return CheckOutcome(False, message=f"structural check: {proof.message}", node=proof.node,
                            tensor=proof.tensor), "structural (refuted)"
    if not proof.proved:
        return None, f"structural check undecided ({proof.message}); sampled"
    verifier.fps.new_generation()
    change = find_change(verifier.snapshot, model, verifier.fps, verifier.values[0].keys())
    if change.problems:
        msg, node, tensor = change.problems[0]
        return CheckOutcome(False, change, message=msg, node=node, tensor=tensor), "structural"
    made = [o.name for n in model.graph for o in n.outputs if o.name and o.name in proof.after]
    results: list[dict[str, np.ndarray]] = [{} for _ in verifier.values]
    keep: set[str] = set()
    for name in made:
        r = proof.after[name]
        found = proof.before.get(r.term)
        if found is None:
            return None, f"structural check undecided (tensor '{name}' has no counterpart before the pass); sampled"
        old_name, old = found
        if old_name == name and old == r:
            keep.add(name)
            continue
        for res, vals in zip(results, verifier.values):
            if old_name not in vals:
                return None, f"structural check undecided (no cached value of '{old_name}'); sampled"
            res[name] = _relayout(vals[old_name], old, r)
    outcome = CheckOutcome(True, change, results=results, keep=keep, region=[], runs=0)
    return outcome, "structural proof (nothing run)"


def _relayout(value: np.ndarray, old: Rep, new: Rep) -> np.ndarray:
    """The value of representation ``new`` from the value of ``old`` (same term)."""
    arr = np.asarray(value)
    if old.cols is not None:
        canon = arr[:, np.argsort(old.cols)]
    elif old.perm and old.perm != identity(len(old.perm)):
        canon = np.transpose(arr, inverse(old.perm))
    else:
        canon = arr
    if new.cols is not None:
        return np.ascontiguousarray(canon[:, list(new.cols)])
    if new.perm and new.perm != identity(len(new.perm)):
        return np.ascontiguousarray(np.transpose(canon, new.perm))
    return canon
