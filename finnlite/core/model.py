"""The finnlite model: one in-memory ``onnx_ir`` graph, loaded once, mutated in place, saved once.

:class:`Model` offers qonnx ``ModelWrapper``'s method names (``get_tensor_shape``, ``get_initializer``,
``find_producer``, ``find_consumers``, ``set_tensor_datatype``, ``transform``, ``save``, ...) on top of
``onnx_ir``, whose use-def chains give producers and consumers in O(1) and whose edits are cheap and local.
Nodes are ``onnx_ir.Node`` objects (``node.inputs`` / ``node.outputs`` are ``onnx_ir.Value`` objects with a
``.name``); tensors are addressed by name as in qonnx, or by value.

Datatype and layout annotations live where qonnx and FINN keep them: the graph's ``quantization_annotation``
entries with the keys ``finn_datatype`` and ``tensor_layout`` (onnx_ir carries them in
``value.meta["quant_parameter_tensor_names"]`` and writes them back on save).
"""

from __future__ import annotations

import ast
import itertools
import logging
import weakref
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from finnlite.core import io as model_io
from finnlite.core.datatypes import BaseDataType, DataType, parse_datatype
from finnlite.core.errors import DataTypeError, FixpointError, GraphError, ModelLoadError
from finnlite.core.cleanup import cleanup as cleanup_model
from finnlite.core.passes import AnalysisPass, run_pass
from finnlite.core.shapes import infer_shapes
from finnlite.core.tensors import DepthwiseWeight, freeze, is_frozen  # noqa: F401 - freeze, is_frozen: re-exported

log = logging.getLogger(__name__)

_QA_KEY = "quant_parameter_tensor_names"
_DT_KEY = "finn_datatype"
_LAYOUT_KEY = "tensor_layout"


def _np_dtype_to_ir(dtype: np.dtype) -> ir.DataType:
    return ir.DataType.from_numpy(np.dtype(dtype))


class Model:
    """A QONNX/FINN-ONNX model held as one ``onnx_ir`` graph.

    Build it from a path, bytes, an ``onnx.ModelProto``, an ``onnx_ir.Model`` or a qonnx ``ModelWrapper``:
    ``Model("net.onnx")``. The source is never modified. Graph inputs that are really initializers (as Brevitas'
    torch.export exporter writes them) are removed from the inputs on load. Structural problems that make the
    graph meaningless (a node input that nothing produces, a tensor produced twice, a cycle) raise
    :class:`GraphError` naming the node and tensor.
    """

    def __init__(self, source: Any, *, check: bool = True) -> None:
        self.path: str | None = None
        if isinstance(source, Model):
            source = source.to_proto()
        if isinstance(source, ir.Model):
            self.ir = source
        else:
            proto, self.path = model_io.load_proto(source)  # a copy of ours
            _drop_initializer_inputs(proto)
            if check:
                _check_single_producers(proto, self.path)
            try:
                self.ir = ir.serde.deserialize_model(proto)
            except Exception as exc:  # onnx_ir reports malformed protos with many exception types
                raise ModelLoadError(f"cannot read the ONNX graph: {exc}", file=self.path) from exc
            detach_tensors(self.ir)
        #: the name index: every name the model has seen, to a weak reference to its value (None: reserved by
        #: make_new_valueinfo_name). Weak, so that a removed node or initializer — its metadata, its array — goes
        #: when the graph lets go of it, not at the next rebuild of the index
        self._values: dict[str, weakref.ref[ir.Value] | None] = {}
        self._name_counter = itertools.count()
        self._remove_initializer_inputs()
        self._reindex()
        if check:
            self.check_graph()

    # -- construction and output ---------------------------------------------------------------------------
    @classmethod
    def load(cls, source: Any, *, check: bool = True) -> "Model":
        """Same as ``Model(source)``."""
        return cls(source, check=check)

    @property
    def graph(self) -> ir.Graph:
        """The ``onnx_ir`` graph (mutable in place)."""
        return self.ir.graph

    def to_proto(self) -> onnx.ModelProto:
        """The model as an ``onnx.ModelProto`` with an IR version onnxruntime accepts."""
        return model_io.to_proto(self.ir)

    def to_qonnx(self) -> Any:
        """The model as a qonnx ``ModelWrapper`` (a new object; later edits to either are not shared)."""
        from qonnx.core.modelwrapper import ModelWrapper

        return ModelWrapper(self.to_proto())

    def save(self, path: str | Path, *, external_data: bool | None = None) -> None:
        """Write the model to ``path`` atomically (a temporary file, then a rename).

        ``external_data=True`` stores large initializers in ``<name>.data`` beside the model; ``None`` chooses it
        only when the model would exceed protobuf's 2 GB limit."""
        model_io.save_model(self.ir, path, external_data=external_data)

    def replace_ir(self, new: ir.Model) -> None:
        """Make ``new`` this model's graph (as a qonnx transformation's result is taken back), rebuilding the name
        index."""
        self.ir = new
        self._reindex()

    def copy(self) -> "Model":
        """An independent deep copy (serializes and reloads; use sparingly)."""
        return Model(self.to_proto(), check=False)

    # -- name index ----------------------------------------------------------------------------------------
    def _remove_initializer_inputs(self) -> None:
        inits = self.graph.initializers
        keep = [v for v in self.graph.inputs if v.name not in inits]
        if len(keep) != len(self.graph.inputs):
            self.graph.inputs.clear()
            self.graph.inputs.extend(keep)

    def _reindex(self) -> None:
        values: dict[str, weakref.ref[ir.Value] | None] = {name: None for name, r in self._values.items() if r is None}
        ref = weakref.ref
        for v in self.graph.inputs:
            values[v.name] = ref(v)
        for name, v in self.graph.initializers.items():
            values[name] = ref(v)
        for node in self.graph:
            for v in node.inputs:
                if v is not None and v.name and v.name not in values:
                    values[v.name] = ref(v)  # dangling inputs, so that check_graph can name them
            for v in node.outputs:
                if v.name:
                    values[v.name] = ref(v)
        self._values = values

    def index_value(self, v: ir.Value) -> None:
        """Record ``v`` under its name in the name index (a new value, or one just renamed): lookups find it at once
        instead of after a rebuild of the index."""
        self._values[v.name] = weakref.ref(v)

    def _indexed(self, name: str) -> ir.Value | None:
        """The value the index holds for ``name`` (None if reserved, unknown or gone)."""
        r = self._values.get(name)
        return None if r is None else r()

    def _alive(self, v: ir.Value, name: str) -> bool:
        if v.name != name:
            return False
        prod = v.producer()
        if prod is not None:
            return prod.graph is self.graph
        return v.graph is self.graph or v.is_graph_input() or bool(v.uses())

    def value(self, name: str) -> ir.Value | None:
        """The ``onnx_ir.Value`` called ``name``, or None. O(1) amortized: the index is rebuilt only when a lookup
        finds a stale entry (after renames or removals)."""
        v = self._indexed(name)
        if v is not None and self._alive(v, name):
            return v
        self._reindex()
        return self._indexed(name)

    def _require(self, name: str) -> ir.Value:
        v = self.value(name)
        if v is None:
            raise GraphError("no such tensor in the graph", tensor=name)
        return v

    def get_all_tensor_names(self) -> list[str]:
        """Names of every graph input, initializer and node output."""
        self._reindex()
        return [name for name, r in self._values.items() if r is not None and r() is not None]

    def make_new_valueinfo_name(self, prefix: str = "t") -> str:
        """A tensor name not yet used in the graph, in O(1): checked against the name index, which holds every
        name the model has seen (values made with :meth:`make_value`/:meth:`make_value_like` are added to it)."""
        while True:
            name = f"{prefix}_{next(self._name_counter)}"
            if name not in self._values:
                self._values[name] = None  # reserved until the caller's value takes it
                return name

    def make_value(self, prefix: str = "t", shape: Sequence[int] | None = None,
                   dtype: Any = np.float32) -> ir.Value:
        """A new, unattached value with a unique name (to use as a node output)."""
        v = ir.Value(name=self.make_new_valueinfo_name(prefix))
        if shape is not None:
            v.shape = ir.Shape(list(shape))
        if dtype is not None:
            v.dtype = _np_dtype_to_ir(dtype)
        self.index_value(v)
        return v

    def make_value_like(self, like: ir.Value, prefix: str | None = None) -> ir.Value:
        """A new, unattached value with a unique name and the shape and element type of ``like`` (where known)."""
        v = ir.Value(name=self.make_new_valueinfo_name(prefix or like.name or "t"))
        if like.shape is not None:
            v.shape = like.shape
        if like.dtype is not None:
            v.dtype = like.dtype
        self.index_value(v)
        return v

    # -- shapes --------------------------------------------------------------------------------------------
    def get_tensor_shape(self, name: str) -> tuple[int | None, ...] | None:
        """The shape of ``name`` as a tuple (None for a symbolic dim), or None if unknown."""
        v = self._require(name)
        if v.shape is None and v.const_value is not None:
            return tuple(v.const_value.shape)
        if v.shape is None:
            return None
        return tuple(d if isinstance(d, int) else None for d in v.shape)

    def set_tensor_shape(self, name: str, shape: Sequence[int | None], dtype: Any = None) -> None:
        """Set the shape (and optionally the numpy element type) of ``name``."""
        v = self._require(name)
        v.shape = ir.Shape(list(shape))
        if dtype is not None:
            v.dtype = _np_dtype_to_ir(dtype)
        elif v.dtype is None:
            v.dtype = ir.DataType.FLOAT

    def infer_shapes(self, *, only_missing: bool = True) -> None:
        """Infer the shape of every node output, custom ops included (see :mod:`finnlite.core.shapes`)."""
        infer_shapes(self, only_missing=only_missing)

    # -- datatypes and layouts -----------------------------------------------------------------------------
    @staticmethod
    def _annotation(v: ir.Value) -> dict[str, str] | None:
        ann = v.meta.get(_QA_KEY)
        return ann if ann else None

    def get_tensor_datatype(self, name: str) -> BaseDataType:
        """The ``finn_datatype`` annotation of ``name``; FLOAT32 when there is none (as in qonnx)."""
        ann = self._annotation(self._require(name))
        if ann and _DT_KEY in ann:
            try:
                return parse_datatype(ann[_DT_KEY])
            except DataTypeError as exc:
                raise DataTypeError(f"bad finn_datatype annotation: {exc.message}", file=self.path,
                                    tensor=name) from None
        return DataType["FLOAT32"]

    def has_tensor_datatype(self, name: str) -> bool:
        """True if ``name`` carries an explicit ``finn_datatype`` annotation."""
        ann = self._annotation(self._require(name))
        return bool(ann and _DT_KEY in ann)

    def set_tensor_datatype(self, name: str, datatype: BaseDataType | str | None) -> None:
        """Annotate ``name`` with ``datatype`` (None removes the annotation)."""
        v = self._require(name)
        ann = dict(v.meta.get(_QA_KEY) or {})
        if datatype is None:
            ann.pop(_DT_KEY, None)
        else:
            ann[_DT_KEY] = parse_datatype(datatype).name
        v.meta[_QA_KEY] = ann

    def get_tensor_layout(self, name: str) -> list[str] | None:
        """The ``tensor_layout`` annotation (e.g. ``["N", "H", "W", "C"]``), or None."""
        ann = self._annotation(self._require(name))
        if not ann or _LAYOUT_KEY not in ann:
            return None
        try:
            layout = ast.literal_eval(ann[_LAYOUT_KEY])
        except (ValueError, SyntaxError) as exc:
            raise GraphError(f"unreadable tensor_layout annotation {ann[_LAYOUT_KEY]!r}", tensor=name) from exc
        return [str(x) for x in layout]

    def set_tensor_layout(self, name: str, layout: Sequence[str] | None) -> None:
        """Annotate ``name`` with a data layout such as ``["N", "C", "H", "W"]`` (None removes it)."""
        v = self._require(name)
        ann = dict(v.meta.get(_QA_KEY) or {})
        if layout is None:
            ann.pop(_LAYOUT_KEY, None)
        else:
            ann[_LAYOUT_KEY] = str([str(x) for x in layout])
        v.meta[_QA_KEY] = ann

    # -- initializers --------------------------------------------------------------------------------------
    def get_initializer(self, name: str) -> np.ndarray | None:
        """The value of initializer ``name`` as a numpy array (a constant node output is not an initializer). A
        :class:`~finnlite.core.tensors.DepthwiseWeight` gives its dense matrix, made anew on each call."""
        v = self.graph.initializers.get(name)
        if v is None or v.const_value is None:
            return None
        return v.const_value.numpy()

    def is_initializer(self, name: str) -> bool:
        """True if ``name`` is an initializer of the graph."""
        return name in self.graph.initializers

    def set_initializer(self, name: str, array: np.ndarray | DepthwiseWeight) -> ir.Value:
        """Create or replace initializer ``name`` with ``array`` (its shape and element type are updated). The
        model takes ``array`` as it is, without a copy, and makes it read-only (:func:`freeze`). A
        :class:`~finnlite.core.tensors.DepthwiseWeight` is kept in its compact form."""
        if isinstance(array, DepthwiseWeight):
            tensor, shape, dtype = array, list(array.shape), array.dtype
            tensor.name = name
        else:
            array = freeze(np.asarray(array))
            tensor, shape, dtype = ir.tensor(array, name=name), list(array.shape), _np_dtype_to_ir(array.dtype)
        v = self.graph.initializers.get(name)
        if v is None:
            reserved = name in self._values and self._values[name] is None
            v = None if reserved else self.value(name)
            if v is not None and v.producer() is not None:
                raise GraphError("cannot make a node output an initializer", tensor=name)
            if v is None:
                v = ir.Value(name=name)
            v.const_value = tensor
            self.graph.register_initializer(v)
        else:
            v.const_value = tensor
        v.shape = ir.Shape(shape)
        v.dtype = dtype
        self.index_value(v)
        return v

    def add_initializer(self, array: np.ndarray | DepthwiseWeight, prefix: str = "c") -> ir.Value:
        """A new initializer with a unique name holding ``array``."""
        return self.set_initializer(self.make_new_valueinfo_name(prefix), array)

    def del_initializer(self, name: str) -> None:
        """Remove initializer ``name`` (its uses, if any, are left dangling: remove them first). The name index
        holds values weakly: the array is freed with the value."""
        self.graph.initializers.pop(name, None)

    def drop_if_unused(self, *values: ir.Value | None) -> None:
        """Remove those of ``values`` that are initializers of the graph nothing reads any more (and not graph
        outputs): a constant a rewrite replaced goes at once, not at the next cleanup, so that a pass replacing
        every weight holds one layer twice at a time, not the whole network."""
        for v in values:
            if v is not None and not v.uses() and not v.is_graph_output() and self.graph.initializers.get(v.name) is v:
                self.del_initializer(v.name)

    # -- graph queries -------------------------------------------------------------------------------------
    def find_producer(self, name: str) -> ir.Node | None:
        """The node that produces ``name``, or None for inputs, initializers and unknown names."""
        v = self.value(name)
        return None if v is None else v.producer()

    def find_consumers(self, name: str) -> list[ir.Node]:
        """The nodes that read ``name`` (each once, in no particular order)."""
        v = self.value(name)
        if v is None:
            return []
        return list(dict.fromkeys(u.node for u in v.uses()))

    def find_consumer(self, name: str) -> ir.Node | None:
        """The single consumer of ``name``, or None if there are zero or several."""
        consumers = self.find_consumers(name)
        return consumers[0] if len(consumers) == 1 else None

    def find_direct_successors(self, node: ir.Node) -> list[ir.Node]:
        """The nodes that read any output of ``node``."""
        return list(dict.fromkeys(u.node for o in node.outputs for u in o.uses()))

    def find_direct_predecessors(self, node: ir.Node) -> list[ir.Node]:
        """The nodes that produce any input of ``node``."""
        preds = (v.producer() for v in node.inputs if v is not None)
        return list(dict.fromkeys(p for p in preds if p is not None))

    def is_fork_node(self, node: ir.Node) -> bool:
        """True if some output of ``node`` has more than one consumer (a graph output counts as one)."""
        return any(len(o.uses()) + int(o.is_graph_output()) > 1 for o in node.outputs)

    def is_join_node(self, node: ir.Node) -> bool:
        """True if ``node`` has more than one input produced by other nodes (not initializers or graph inputs)."""
        return sum(1 for v in node.inputs if v is not None and v.producer() is not None) > 1

    def get_nodes_by_op_type(self, op_type: str) -> list[ir.Node]:
        """All nodes of the given op type, in graph order."""
        return [n for n in self.graph if n.op_type == op_type]

    def get_node_from_name(self, name: str) -> ir.Node | None:
        """The node called ``name``, or None."""
        return next((n for n in self.graph if n.name == name), None)

    def nodes(self) -> Iterator[ir.Node]:
        """The nodes in graph order."""
        return iter(self.graph)

    def op_histogram(self) -> dict[str, int]:
        """Node counts by op type, most frequent first."""
        counts: dict[str, int] = {}
        for n in self.graph:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    # -- edits ---------------------------------------------------------------------------------------------
    def give_unique_node_names(self, prefix: str = "") -> None:
        """Rename every node ``<prefix><OpType>_<k>`` (k counts per op type), as qonnx's GiveUniqueNodeNames."""
        counts: dict[str, int] = {}
        for node in self.graph:
            k = counts.get(node.op_type, 0)
            counts[node.op_type] = k + 1
            node.name = f"{prefix}{node.op_type}_{k}"

    def make_node_names_unique(self) -> bool:
        """Name every unnamed node ``<OpType>_<k>`` and give a repeated name a suffix ``_<k>`` (its first node
        keeps it); names that are unique already stay, unlike :meth:`give_unique_node_names`. onnxruntime refuses a
        graph with two nodes of one name, and rewrites name their nodes after the node they replace. True if a name
        changed."""
        taken = {n.name for n in self.graph if n.name}
        seen: set[str] = set()
        counters: dict[str, int] = {}
        changed = False
        for node in self.graph:
            if node.name and node.name not in seen:
                seen.add(node.name)
                continue
            base = node.name or node.op_type
            k = counters.get(base, 0)
            while f"{base}_{k}" in taken:
                k += 1
            node.name = f"{base}_{k}"
            counters[base] = k + 1
            taken.add(node.name)
            seen.add(node.name)
            changed = True
        return changed

    def give_unique_tensor_names(self, prefix: str = "") -> None:
        """Rename every node output to a unique readable name (graph inputs and outputs keep theirs)."""
        used = {v.name for v in self.graph.inputs} | {v.name for v in self.graph.outputs}
        used |= set(self.graph.initializers)
        for node in self.graph:
            for i, out in enumerate(node.outputs):
                if out.is_graph_output():
                    continue
                base = f"{prefix}{node.name or node.op_type}_out{i}"
                name, k = base, 0
                while name in used:
                    k += 1
                    name = f"{base}_{k}"
                used.add(name)
                out.name = name
        self._reindex()

    def topological_sort(self) -> None:
        """Sort the nodes topologically (stable); a :class:`GraphError` if the graph has a cycle."""
        try:
            self.graph.sort()
        except ValueError as exc:
            raise GraphError(f"the graph has a cycle ({exc})", file=self.path) from exc

    def remove_node(self, node: ir.Node) -> None:
        """Detach ``node`` from its inputs and remove it (its outputs must be unused or rewired already)."""
        self.graph.remove(node, safe=True)

    def replace_uses(self, old: ir.Value, new: ir.Value) -> None:
        """Make every consumer of ``old`` read ``new``; a graph output ``old`` is replaced by ``new`` (which takes
        over the output's name, so the model's interface is unchanged). Where ``new`` cannot be renamed without
        changing the interface (it is a graph input, or already a graph output), the output becomes instead a new
        value ``Identity(new)`` with the output's name, and ``new`` keeps its own."""
        if new is old:
            return
        if not old.is_graph_output():
            old.replace_all_uses_with(new)
            return
        out_name = old.name
        if new.is_graph_input() or new.is_graph_output():
            new = self._identity_of(new, out_name)
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        old.name = self.make_new_valueinfo_name(out_name + "_old")
        new.name = out_name
        self.index_value(new)

    def _identity_of(self, v: ir.Value, out_name: str) -> ir.Value:
        """A new value ``Identity(v)`` (appended to the graph) with the shape, element type and annotations of ``v``."""
        copy = self.make_value_like(v, prefix=out_name)
        if v.meta.get(_QA_KEY):
            copy.meta[_QA_KEY] = dict(v.meta[_QA_KEY])
        names = {n.name for n in self.graph}
        node_name = f"{out_name}_identity"
        while node_name in names:
            node_name = f"{out_name}_identity_{next(self._name_counter)}"
        self.graph.append(ir.Node("", "Identity", [v], outputs=[copy], name=node_name))
        return copy

    def bypass_node(self, node: ir.Node, input_index: int = 0) -> None:
        """Remove a single-output node whose output equals one of its inputs (e.g. an identity rewrite)."""
        self.replace_uses(node.outputs[0], node.inputs[input_index])
        self.remove_node(node)

    def cleanup(self, fold_constants: bool = True) -> bool:
        """Remove dead nodes and unused initializers and (optionally) fold standard ops whose inputs are all
        constant. Returns True if anything changed. See :mod:`finnlite.core.cleanup`."""
        return cleanup_model(self, fold=fold_constants)

    # -- checks --------------------------------------------------------------------------------------------
    def check_graph(self) -> None:
        """Raise :class:`GraphError` for an input nothing produces, a tensor produced twice, a cycle or a graph
        output nothing produces."""
        if not self.graph.outputs:
            raise GraphError("the graph has no outputs", file=self.path)
        produced: set[str] = {v.name for v in self.graph.inputs} | set(self.graph.initializers)
        for node in self.graph:
            for v in node.inputs:
                if v is None:
                    continue
                if v.producer() is None and not v.is_graph_input() and not v.is_initializer():
                    raise GraphError("input is not produced by any node, graph input or initializer",
                                     file=self.path, node=node.name or node.op_type, tensor=v.name)
            for v in node.outputs:
                if v.name in produced:
                    raise GraphError("tensor is produced more than once", file=self.path,
                                     node=node.name or node.op_type, tensor=v.name)
                produced.add(v.name)
        for v in self.graph.outputs:
            if v.producer() is None and not v.is_graph_input() and not v.is_initializer():
                raise GraphError("graph output is not produced by any node", file=self.path, tensor=v.name)
        self._check_acyclic()

    def _check_acyclic(self) -> None:
        state: dict[int, int] = {}
        for start in self.graph:
            if id(start) in state:
                continue
            stack: list[tuple[ir.Node, Iterator[ir.Node]]] = [(start, iter(self.find_direct_predecessors(start)))]
            state[id(start)] = 1
            while stack:
                node, preds = stack[-1]
                nxt = next(preds, None)
                if nxt is None:
                    state[id(node)] = 2
                    stack.pop()
                elif state.get(id(nxt)) == 1:
                    raise GraphError("the graph has a cycle", file=self.path, node=nxt.name or nxt.op_type)
                elif id(nxt) not in state:
                    state[id(nxt)] = 1
                    stack.append((nxt, iter(self.find_direct_predecessors(nxt))))

    # -- passes --------------------------------------------------------------------------------------------
    def transform(self, transformation: Any, make_deepcopy: bool = False, cleanup: bool = False,
                  max_iterations: int = 100) -> "Model":
        """Apply a pass in place until it changes nothing, as qonnx's ``ModelWrapper.transform`` does, and return
        ``self``, so that ``model = model.transform(SomePass())`` works. ``transformation`` is a finnlite pass, a
        qonnx Transformation or a function of the model (see :func:`finnlite.core.passes.run_pass`). Unlike qonnx,
        nothing is deep-copied (``make_deepcopy`` is accepted for compatibility and ignored), and ``cleanup=True``
        runs :meth:`cleanup` afterwards. A pass still changing the model after ``max_iterations`` runs raises
        :class:`~finnlite.core.errors.FixpointError`."""
        for _ in range(max_iterations):
            if not run_pass(self, transformation):
                break
        else:
            name = getattr(transformation, "name", None) or getattr(transformation, "__name__", repr(transformation))
            raise FixpointError(f"{name} still changed the model after {max_iterations} runs")
        if cleanup:
            self.cleanup()
        return self

    def execute(self, inputs: Any, **options: Any) -> dict[str, np.ndarray]:
        """Run the model on ``inputs`` ({input name: array}, or one array for a single-input model) with the
        executor (the verification oracle, :class:`custom_ops.executor.Executor`; ``options`` go to it, e.g.
        ``dtype=np.float64``) and return {output name: array}. A leading dim that is a multiple of the exported
        batch runs a batch. (``import finnlite`` registers the executor; importing only ``finnlite.core`` does not.)
        """
        from finnlite.core.ops import executor_factory

        return executor_factory()(self, **options).run(inputs)

    def analysis(self, analysis: Any) -> Any:
        """Run an analysis pass (instance, class or plain function of the model) and return its result."""
        if isinstance(analysis, type) and issubclass(analysis, AnalysisPass):
            analysis = analysis()
        if isinstance(analysis, AnalysisPass):
            return analysis.analyze(self)
        return analysis(self)

    # -- misc ----------------------------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.graph.outputs]

    def opset_version(self, domain: str = "") -> int | None:
        """The imported opset version of ``domain`` (default ONNX domain), or None."""
        return self.graph.opset_imports.get(domain)

    def __len__(self) -> int:
        return self.graph.num_nodes()

    def __repr__(self) -> str:
        src = f" from '{self.path}'" if self.path else ""
        return f"<finnlite.Model{src}: {len(self)} nodes, inputs {self.input_names}, outputs {self.output_names}>"


def _check_single_producers(proto: onnx.ModelProto, path: str | None) -> None:
    """Raise :class:`GraphError` if a tensor name is produced twice (onnx_ir cannot represent such a graph)."""
    produced = {v.name for v in proto.graph.input} | {t.name for t in proto.graph.initializer}
    for node in proto.graph.node:
        for name in node.output:
            if not name:
                continue
            if name in produced:
                raise GraphError("tensor is produced more than once", file=path,
                                 node=node.name or node.op_type, tensor=name)
            produced.add(name)


def _drop_initializer_inputs(proto: onnx.ModelProto) -> None:
    """Remove the graph inputs that are initializers (as Brevitas' torch.export exporter writes them) from
    ``proto`` before onnx_ir reads it: removed from an onnx_ir graph's inputs afterwards, each stays referenced by
    the input list (onnx_ir keeps a count of 0 for it), and with it its weight, after a pass replaced it."""
    inits = {t.name for t in proto.graph.initializer}
    keep = [vi for vi in proto.graph.input if vi.name not in inits]
    if len(keep) != len(proto.graph.input):
        del proto.graph.input[:]
        proto.graph.input.extend(keep)


def as_model(source: Any) -> Model:
    """``source`` if it is a :class:`Model`, else ``Model(source)``."""
    return source if isinstance(source, Model) else Model(source)


def iter_values(model: Model) -> Iterable[ir.Value]:
    """Every value of the graph: inputs, initializers, node outputs."""
    yield from model.graph.inputs
    yield from model.graph.initializers.values()
    for node in model.graph:
        yield from node.outputs


#: tensors read from a proto with up to this many elements get a proto of their own (see :func:`detach_tensors`)
DETACH_ELEMENTS = 1 << 14

#: element types whose tensors read from a proto become numpy arrays (plain numpy dtypes: the array round-trips)
_ARRAY_TYPES = {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.INT8, ir.DataType.UINT8,
                ir.DataType.INT16, ir.DataType.UINT16, ir.DataType.INT32, ir.DataType.UINT32, ir.DataType.INT64,
                ir.DataType.UINT64, ir.DataType.BOOL}


def detach_tensors(model: ir.Model) -> None:
    """Make the constants read from a ModelProto (initializers and Constant values of the main graph) independent of
    it, so that the loaded message is freed as soon as loading ends. onnx_ir keeps such a tensor as a view of the
    message, and with protobuf's upb backend any view keeps the whole message alive (every weight of the file), and
    every read of a view's data copies it. Large numeric tensors (the weights) become frozen numpy arrays
    (:func:`freeze`), which everything else then shares without copies: the reference snapshot, the executors,
    the verifier. Small ones (biases, scales, shapes) and other element types get protos of their own."""
    def detached(t: Any) -> Any:
        if not isinstance(t, ir.serde.TensorProtoTensor):
            return t
        if t.size > DETACH_ELEMENTS and t.dtype in _ARRAY_TYPES:
            return ir.Tensor(freeze(t.numpy()), dtype=t.dtype, name=t.name, doc_string=t.doc_string or None,
                             metadata_props=dict(t.metadata_props) or None)
        proto = onnx.TensorProto()
        proto.CopyFrom(t.raw)
        return ir.serde.TensorProtoTensor(proto)

    for v in model.graph.initializers.values():
        if v.const_value is not None:
            v.const_value = detached(v.const_value)
    for node in model.graph:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.TENSOR:
                t = detached(attr.value)
                if t is not attr.value:
                    node.attributes[attr.name] = ir.AttrTensor(attr.name, t, doc_string=attr.doc_string)
