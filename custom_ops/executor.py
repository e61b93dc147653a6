"""The executor: the verification oracle, fast and bit-exact.

:class:`Executor` runs a QONNX/FINN-ONNX model and computes, bit for bit, what qonnx's ``execute_onnx`` computes
(one fresh onnxruntime session per standard node, numpy kernels for custom nodes), but much faster
(``bench/bench_executor.py`` measures how much):

* **Plan once.** The graph is sorted and checked (unknown custom ops, inputs nothing produces) and constant-folded
  once: every node whose inputs are all constants (the weight quantizers) is computed at construction exactly as
  execution would compute it. The rest is cut, in topological order, into maximal *regions* of standard nodes —
  each one onnxruntime session, created on first use and reused — and single nodes run by numpy kernels
  (``custom_ops.registry``). Plans are cached: one for outputs (which drops each tensor after its last reader),
  one exposing every tensor (``return_all``), one exposing every tensor but the windows of fused convolutions
  (``windows=False``), and the same for vectorized batches.
* **Lower the custom ops.** Quant, BipolarQuant, MultiThreshold, Trunc and Im2Col become exact standard-op subgraphs inside
  the regions (:mod:`custom_ops.lowering`), so a quantized network usually runs as one session. A node whose
  lowering cannot be exact (a parameter that is not constant, a mixed dtype, an opset below 11) runs its kernel;
  :meth:`Executor.describe` lists the steps and says why.
* **Integer convolutions.** In a float32 plan, an ``Im2Col → MatMul`` pair whose
  operands are provably small integers (a MultiThreshold's counts, integer weights, every partial sum below 2**24)
  runs as one ``Conv``: the result is the exact integer either way, so it is bit-identical, without materializing
  the windows (unless they are asked for) or multiplying the zeros of a depthwise block-diagonal matrix
  (:mod:`custom_ops.intconv`).
* **float64.** ``Executor(model, dtype=np.float64)`` casts float initializers and inputs to float64 and runs every
  node in double precision (the verifier runs the original model so to tell float32 near-ties from bugs): Casts
  to float32 cast to float64, lowerings are built in float64, custom-op kernels get float64 arrays (a float32
  result is cast back up), and the standard ops onnxruntime has no double kernel for — Conv, AveragePool,
  GlobalAveragePool — run alone through :mod:`custom_ops.float64_ops`. A Quant of float32 constants only (a weight
  quantizer) computes a parameter of the model, not a data-dependent value: its integers come from float32, as
  Brevitas, qonnx and the convert stage compute the integer weights, and its value from them exactly
  (:class:`~custom_ops.float64_ops.Float32Parameters`).

**Session options.** Regions use ``ORT_DISABLE_ALL`` *and*
``session.disable_prepacking=1``; nothing else is bit-identical to qonnx's per-node sessions. qonnx feeds every
input — weights included — to a one-node session with default options (``ORT_ENABLE_ALL``), so onnxruntime can
neither fuse nodes nor treat weights as constants. In a region the folded weights are initializers, and:
(1) prepacking constant Gemm/MatMul weights takes another MLAS path that rounds differently, at every optimization
level (tfc, resnet18 and mobilenet Gemm outputs differ in the last bits); (2) ``ORT_ENABLE_BASIC`` and above fold
BatchNormalization/Add/Mul into Conv and Gemm, and ``ORT_ENABLE_ALL`` adds NCHWc convolutions, each changing float32
results. The zoo's quantized outputs hide most of this (the next quantizer absorbs small errors), so the study also
runs each zoo model with its activation quantizers replaced by Identity: there only ``ORT_DISABLE_ALL`` without
prepacking matches qonnx on every model (``bench/bench_executor.py --study`` prints the table). (3) Conversely a
*lone* pooling node with known shapes at ``ORT_ENABLE_ALL`` — qonnx's case — runs as an NCHWc kernel, which can
pick the other zero in a max over −0.0 and +0.0 (seen on cnv_2w2a's MaxPool); so MaxPool, AveragePool and the
global pools run alone, as qonnx runs them (:class:`~custom_ops.plan.NodeSessionStep`). With these, every tensor
of every zoo model is bit-identical to qonnx's (``tests/custom_ops/test_executor_zoo.py``). Optimizations off cost
little: the weights are folded at plan time and the graph is a few sessions instead of hundreds of nodes.

**Batches.** Inputs may carry a batch N in place of the model's fixed batch dim b0 (usually 1). onnxruntime's
kernels are *not* batch-invariant: Gemm and Conv pick other MLAS blockings for other sizes, so row i of a batched
run can differ in the last bits from running item i alone (networks with their quantizers removed show it), and the
thread count can matter the same way (keep the default, as qonnx does). Hence ``batch_mode="per_item"`` (default)
runs the batch in chunks of b0 through the b0 plan — exactly what running each item alone gives — and
``batch_mode="vectorized"`` runs it in one go: region inputs are declared with unknown dims, and a ``Reshape``
whose constant shape hard-codes b0 (the ``[1, -1]`` of a flatten) is rewritten to ``[-1, d1, ...]`` from the
static shapes when input and output both keep b0 on axis 0 (then row i stays row i). If that run fails or an
output loses the batch dim, the executor warns and falls back to chunks for good. Chunking assumes every
non-constant tensor carries the batch on axis 0, as inference graphs do.

Deliberate differences to qonnx: the executor does not "sanitize" tensors to their quantization annotations (qonnx
rounds values an annotation says are integers, when they nearly are); it computes what the nodes compute. Nodes
that do not contribute to an output are not run (unless ``return_all``).
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from custom_ops import registry
from custom_ops.base import CustomOp
from custom_ops.common import execute_by_rows
from custom_ops.float64_ops import FLOAT64_KERNELS, PARAMETER_QUANTIZERS, Float32Parameters, Float64Op
from custom_ops.intconv import fuse_im2col_matmul
from custom_ops.lowering import Lowering, LoweringContext, NotLowerable, lower_node
from custom_ops.plan import (FEED_ELEMENTS, Kernel, KernelStep, NodeSessionStep, Plan, RegionStep, Step,
                             as_model_proto, node_inputs, node_label, value_info_dims)
from finnlite.core.compat import fix_ir_version
from finnlite.core.errors import FinnliteError, GraphError, OpError
from finnlite.core.tensors import DepthwiseWeight

log = logging.getLogger(__name__)

#: ops whose results are not a function of their inputs: never folded at plan time
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli"}
#: custom ops whose output has the shape of their first input (for static shape inference)
_SHAPE_PRESERVING = {"Quant", "IntQuant", "BipolarQuant", "Trunc", "MultiThreshold"}
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
#: weight quantizers that constant folding computes with their kernels by blocks of rows (custom_ops.common.by_rows)
_FOLDED_BY_ROWS = {"Quant", "IntQuant", "BipolarQuant"}
#: standard ops run alone, as qonnx runs them (see NodeSessionStep): onnxruntime's NCHWc pooling kernels, which it
#: picks for a lone pooling node with known shapes, can differ from the plain ones (max of -0.0 and +0.0)
_ALONE = {"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool", "LpPool", "GlobalLpPool"}
BATCH_MODES = ("per_item", "vectorized")
#: element types onnxruntime's Python API cannot return as numpy arrays (packed 4-bit types)
_NO_NUMPY_TYPES = frozenset(getattr(onnx.TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1")
                            if hasattr(onnx.TensorProto, name))
#: the plan mode of ``run(return_all=True, windows=False)``: every tensor but the fused pairs' windows
_ALL_BUT_WINDOWS = "all-but-windows"


class Executor:
    """Runs a QONNX / FINN-ONNX model: onnxruntime regions for standard (and lowered custom) ops, numpy kernels for
    the rest; bit-exact to qonnx's ``execute_onnx``.

    ``model``: an ``onnx.ModelProto``, a path, bytes, an object with ``to_proto()`` or a qonnx ModelWrapper (it is
    copied: later edits to ``model`` do not reach the executor). ``dtype``: ``np.float32`` (the model's own
    arithmetic) or ``np.float64``. ``lower``: run Quant, BipolarQuant, MultiThreshold and Trunc inside the
    regions (exact; False runs their kernels). ``batch_mode``: ``"per_item"`` or ``"vectorized"`` (see the module
    docstring). ``threads``: onnxruntime intra-op threads (its default when None; other counts may change Gemm
    rounding). ``constants``: further initializers by name, as arrays (large weights need not be serialized into
    ``model``; a graph input of that name becomes a constant), or as :class:`~finnlite.core.tensors.DepthwiseWeight`
    tensors, kept compact: a fused depthwise ``Im2Col → MatMul`` runs on the kernel, and the dense matrix is made
    (once) only for a node that reads it otherwise; such a constant is left out of ``return_all`` results unless it
    was made dense. Raises :class:`GraphError` for a malformed graph and :class:`OpError` for an unknown custom
    op.
    """

    def __init__(self, model: Any, *, dtype: Any = np.float32, lower: bool = True, batch_mode: str = "per_item",
                 threads: int | None = None, constants: Mapping[str, np.ndarray] | None = None) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be float32 or float64, not {self.dtype}")
        if batch_mode not in BATCH_MODES:
            raise ValueError(f"batch_mode must be one of {BATCH_MODES}, not {batch_mode!r}")
        self.lower, self.batch_mode, self.threads = lower, batch_mode, threads
        proto = as_model_proto(model)
        fix_ir_version(proto)
        graph = proto.graph
        self._opset_imports = [o for o in proto.opset_import if not registry.is_custom_domain(o.domain)]
        self._functions = list(proto.functions)
        self._opset = next((o.version for o in proto.opset_import if registry.is_standard_domain(o.domain)), 0)

        self._constants = {t.name: self._const(numpy_helper.to_array(t)) for t in graph.initializer}
        #: constants that are float32 in the model (widened in float64 mode): a quantizer of only such constants
        #: computes a parameter of the model, its integers in float32 (custom_ops.float64_ops.Float32Parameters)
        self._float32 = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
        #: depthwise weight matrices held as their kernels (see the class docstring); made dense by _dense
        self._sparse: dict[str, DepthwiseWeight] = {}
        for name, value in (constants or {}).items():  # further initializers, given as arrays (not serialized)
            if isinstance(value, DepthwiseWeight):
                self._sparse[name] = value
                continue
            if np.asarray(value).dtype == np.float32:
                self._float32.add(name)
            self._constants[name] = self._const(value).view()  # a view: made read-only below, the caller's is not
        self._inputs = [vi for vi in graph.input if vi.name not in self._constants and vi.name not in self._sparse]
        self._input_shapes = {vi.name: value_info_dims(vi) for vi in self._inputs}
        self._input_dtypes = {vi.name: self._input_dtype(vi) for vi in self._inputs}
        self._outputs = [vi.name for vi in graph.output]
        self._value_info = list(graph.value_info) + list(graph.input) + list(graph.output)
        self._names: set[str] = set()
        self._types: dict[str, int] = {}  # element types, known after _static_shapes
        nodes = self._sorted_nodes(graph)
        # the op version a custom node runs as follows its domain's opset import, 1 if absent (as in qonnx)
        versions = {o.domain: o.version for o in proto.opset_import}
        ops = {i: registry.make_op(n, versions.get(n.domain, 1)) for i, n in enumerate(nodes)
               if not registry.is_standard_domain(n.domain)}
        self._nodes, self._ops = self._fold_constants(nodes, ops)
        for arr in self._constants.values():
            arr.setflags(write=False)
        self._shapes = self._static_shapes()
        self._lowered, self._kernels = self._classify()
        # Im2Col → MatMul pairs with small integer operands run as one Conv (exact: custom_ops.intconv)
        self._fused = (fuse_im2col_matmul(self._nodes, self._ops, self._constants,
                                          self._lowering_context(self._shapes), self._outputs, self._sparse)
                       if self.lower else {})
        for name in self._outputs:
            if name in self._sparse:
                self._dense(name)
        self._plans: dict[tuple[bool, bool], Plan] = {}
        self._chunk_batches = batch_mode == "per_item"
        if log.isEnabledFor(logging.DEBUG):
            log.debug("executor plan:\n%s", self.describe())

    # -- public ---------------------------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        """The data inputs (graph inputs without an initializer), in graph order."""
        return [vi.name for vi in self._inputs]

    @property
    def output_names(self) -> list[str]:
        """The graph outputs, in graph order."""
        return list(self._outputs)

    def static_shape(self, name: str) -> tuple[int, ...] | None:
        """The shape of tensor ``name`` known before running (None if unknown or partly symbolic)."""
        shape = self._shapes.get(name)
        return tuple(shape) if shape is not None and all(d is not None for d in shape) else None

    def folded(self, name: str) -> np.ndarray | None:
        """The value of tensor ``name`` if it is a constant of the model or one folded at construction (a weight
        quantizer's output, read-only), else None."""
        return self._constants.get(name)

    def input_shape(self, name: str) -> tuple[int | None, ...] | None:
        """The declared shape of data input ``name`` (None for a symbolic dim; None if undeclared)."""
        return self._input_shapes[name]

    def run(self, inputs: Mapping[str, np.ndarray] | np.ndarray, return_all: bool = False, *,
            windows: bool = True, outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """The graph outputs for ``inputs`` ({data input name: array}, or the array alone for a model with one data
        input: ``Executor(model).run(x)``); with ``return_all``, every tensor: the
        inputs, the constants (initializers and folded tensors, read-only) and every node output. With
        ``windows=False`` (and ``return_all``), the outputs of ``Im2Col`` nodes that only a MatMul run with them as
        one Conv reads are left out: they are not computed (:mod:`custom_ops.intconv`; they are ``kh·kw`` times
        their input, and the caller can make them from it). ``outputs`` (without ``return_all``): the tensors to
        return instead of the graph outputs, any tensor of the graph (one plan per list, built on first use: the
        same executor serves other tensors without being built again).

        A leading dim N (a multiple of the model's fixed batch dim b0) runs a batch, see ``batch_mode``. Raises
        :class:`GraphError` naming the tensor for an unknown or missing input or a wrong dtype or shape, and
        :class:`OpError` naming the node when a node fails."""
        if not isinstance(inputs, Mapping):
            if len(self._inputs) != 1:
                raise GraphError(f"the model has {len(self._inputs)} data inputs {self.input_names}: give a dict "
                                 "{name: array}")
            inputs = {self._inputs[0].name: inputs}
        if return_all and not windows:
            return_all = _ALL_BUT_WINDOWS  # type: ignore[assignment]
        wanted = None if return_all or outputs is None else tuple(outputs)
        for name in wanted or ():
            if name not in self._names:
                raise GraphError("no tensor of this name in the model", tensor=name)
        arrays, batch = self._check_inputs(inputs)
        if batch is None:
            return self._execute(arrays, batched=False, return_all=return_all, wanted=wanted)
        if not self._chunk_batches:
            try:
                result = self._execute(arrays, batched=True, return_all=return_all, wanted=wanted)
                if self._batch_ok(result, batch):
                    return result
                reason = "an output lost the batch dimension"
            except FinnliteError as exc:
                reason = str(exc)
            log.warning("vectorized batch execution failed (%s); running batches in chunks of %d from now on",
                        reason, self._batch0())
            self._chunk_batches = True
        return self._run_chunks(arrays, batch, return_all, wanted)

    def describe(self) -> str:
        """The plan, one line per step: regions (node counts) and kernel nodes (with why they are not lowered)."""
        plan = self._plan(batched=False, return_all=False)
        alone = sum(1 for kernel, _ in self._kernels.values() if kernel is None)
        lines = [f"{len(self._nodes)} nodes to run after folding {len(self._constants)} constants; "
                 f"{len(self._lowered)} custom nodes lowered, {len(self._kernels) - alone} run as kernels, "
                 f"{alone} in sessions of their own"]
        return "\n".join(lines + [step.describe() for step in plan.steps])

    def standard_model(self) -> onnx.ModelProto:
        """The graph as this executor runs it, as one standard-op model: constants folded into initializers,
        custom ops lowered, dead nodes dropped (to benchmark against a plain onnxruntime session, and to debug).
        An :class:`OpError` if some node runs as a kernel."""
        for i, (kernel, reason) in self._kernels.items():
            if kernel is not None:
                raise OpError(f"{self._nodes[i].op_type} runs as a kernel ({reason})",
                              node=node_label(self._nodes[i], i))
        region = self._region(self._live_nodes(return_all=False), batched=False)
        region.outputs = list(self._outputs)
        feeds = {vi.name: np.zeros(0, self._input_dtypes[vi.name]) for vi in self._inputs}
        model = region.model(feeds)
        del model.graph.input[:]
        model.graph.input.extend(self._inputs)
        return model

    # -- construction ---------------------------------------------------------------------------------------
    def _float(self, dtype: np.dtype) -> np.dtype:
        """The element type a constant of ``dtype`` has in this executor (float64 mode widens floats)."""
        dtype = np.dtype(dtype)
        return np.dtype(np.float64) if self.dtype == np.float64 and dtype.kind == "f" else dtype

    def _dense(self, name: str) -> np.ndarray:
        """Constant ``name`` as an array: a depthwise weight held compact is made dense now, once, and kept."""
        if name not in self._constants:
            self._constants[name] = self._const(self._sparse[name].numpy())
            self._constants[name].setflags(write=False)
        return self._constants[name]

    def _const(self, value: np.ndarray) -> np.ndarray:
        value = np.asarray(value)
        if self.dtype == np.float64 and value.dtype.kind == "f" and value.dtype != np.float64:
            value = value.astype(np.float64)
        return np.ascontiguousarray(value)

    def _input_dtype(self, vi: onnx.ValueInfoProto) -> np.dtype:
        elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)) if elem else self.dtype
        return np.dtype(np.float64) if dtype.kind == "f" and self.dtype == np.float64 else dtype

    def _fresh(self, hint: str) -> str:
        """A tensor or node name not used anywhere in the model."""
        name, k = hint, 0
        while name in self._names:
            k += 1
            name = f"{hint}_{k}"
        self._names.add(name)
        return name

    def _sorted_nodes(self, graph: onnx.GraphProto) -> list[onnx.NodeProto]:
        """The nodes in topological order (stable: a sorted graph keeps its order); GraphError on a tensor
        produced twice, an input nothing produces, a graph output nothing produces, or a cycle."""
        nodes = list(graph.node)
        available = set(self._constants) | set(self._sparse) | set(self._input_shapes)
        self._names = available | {vi.name for vi in self._value_info}
        producer: dict[str, int] = {}
        for i, node in enumerate(nodes):
            self._names.add(node.name)
            for t in node.output:
                if t and (t in producer or t in available):
                    raise GraphError("tensor is produced twice", node=node_label(node, i), tensor=t)
                if t:
                    producer[t] = i
                    self._names.add(t)
        for name in self._outputs:
            if name not in producer and name not in available:
                raise GraphError("graph output is not produced by any node", tensor=name)
        consumers: list[list[int]] = [[] for _ in nodes]
        indegree = [0] * len(nodes)
        for i, node in enumerate(nodes):
            deps = set()
            for t in node_inputs(node):
                if t in producer:
                    deps.add(producer[t])
                elif t not in available:
                    raise GraphError("input is not produced by any node and is neither a graph input nor an "
                                     "initializer", node=node_label(node, i), tensor=t)
            for d in deps:
                consumers[d].append(i)
            indegree[i] = len(deps)
        ready = [i for i in range(len(nodes)) if indegree[i] == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for c in consumers[i]:
                indegree[c] -= 1
                if indegree[c] == 0:
                    heapq.heappush(ready, c)
        if len(order) != len(nodes):
            stuck = [node_label(nodes[i], i) for i in range(len(nodes)) if indegree[i] > 0]
            raise GraphError(f"the graph has a cycle through {len(stuck)} nodes ({', '.join(stuck[:5])})",
                             node=stuck[0])
        return [nodes[i] for i in order]

    def _lowering_context(self, shapes: Mapping[str, tuple[int | None, ...]]) -> LoweringContext:
        return LoweringContext(constants=self._constants, shapes=shapes, dtype=self.dtype, opset=self._opset,
                               fresh=self._fresh, types=self._types)

    def _fold_constants(self, nodes: list[onnx.NodeProto], ops: dict[int, CustomOp]
                        ) -> tuple[list[onnx.NodeProto], dict[int, CustomOp]]:
        """Compute every node whose inputs are all constants now, as execution would, and drop it: custom nodes
        through their lowerings (their kernels if none) and standard nodes, consecutive ones batched into one
        onnxruntime session (a region computes what one session per node computes; the weight quantizers of a
        network then cost one session instead of one each), pooling ops alone as in a plan."""
        kept: list[onnx.NodeProto] = []
        kept_ops: dict[int, CustomOp] = {}
        batch: list[tuple[list[onnx.NodeProto], dict[str, np.ndarray], list[str], str]] = []
        pending: set[str] = set()  # the outputs of the batch, computed at the next flush

        def flush() -> None:
            if not batch:
                return
            region_nodes = [n for b in batch for n in b[0]]
            consts = {k: v for b in batch for k, v in b[1].items()}
            produced = {t for n in region_nodes for t in n.output if t}
            consts.update({t: self._constants[t] for n in region_nodes for t in node_inputs(n)
                           if t in self._constants and t not in produced})
            outputs = [t for b in batch for t in b[2]]
            step = RegionStep(region_nodes, [], outputs, consts, self._opset_imports, self._functions,
                              [b[3] for b in batch], self.threads)
            env: dict[str, np.ndarray] = {}
            try:
                step.run(env)
            except OpError:
                if len(batch) == 1:
                    raise
                for item_nodes, item_consts, item_outputs, label in batch:  # one by one: name the failing node
                    item = dict(item_consts)
                    item.update({t: env[t] if t in env else self._constants[t] for n in item_nodes
                                 for t in node_inputs(n) if t in env or t in self._constants})
                    RegionStep(item_nodes, [], item_outputs, item, self._opset_imports, self._functions, [label],
                               self.threads).run(env)
            for t in outputs:
                self._constants[t] = self._const(env[t])
            batch.clear()
            pending.clear()

        for i, node in enumerate(nodes):
            inputs = node_inputs(node)
            # a weight quantizer, or anything else reading a large constant
            reads_large = any(t in self._constants and self._constants[t].size >= FEED_ELEMENTS for t in inputs)
            if self._is_parameter_quantizer(node, i, ops):
                # float64 mode: a quantizer of float32 parameters is folded with its integers from float32
                out = node.output[0]
                self._constants[out] = self._const(execute_by_rows(Float32Parameters(ops[i]),
                                                                   [self._constants[t] for t in node.input]))
                self._float32.add(out)
                continue
            if (reads_large and i in ops and node.op_type in _FOLDED_BY_ROWS and self.dtype == np.float32
                    and len(node.output) == 1 and all(t in self._constants for t in node.input)):
                # a weight quantizer: folded by its numpy kernel (qonnx's own arithmetic, bit for bit what the
                # lowering computes) over blocks of rows, without the weight-sized temporaries of a session
                out, args = node.output[0], [self._constants[t] for t in node.input]
                self._constants[out] = self._const(execute_by_rows(ops[i], args))
                continue
            if (not all(t in self._constants or t in pending for t in inputs)
                    or not (inputs or node.op_type == "Constant") or node.op_type in _NONDETERMINISTIC):
                if i in ops:
                    kept_ops[len(kept)] = ops[i]
                kept.append(node)
                continue
            label = node_label(node, i)
            outputs = [t for t in node.output if t]
            if i in ops:
                try:
                    shapes = {t: self._constants[t].shape for t in inputs if t in self._constants}
                    if len(shapes) < len(inputs):
                        flush()
                        shapes = {t: self._constants[t].shape for t in inputs}
                    lowering = lower_node(node, ops[i], self._lowering_context(shapes))
                    batch.append((lowering.nodes, dict(lowering.constants), outputs, label))
                    pending.update(outputs)
                    continue
                except NotLowerable as exc:
                    step: Step = KernelStep(node, ops[i], label, str(exc), upcast=self.dtype == np.float64)
            elif (self.dtype == np.float64 and node.op_type in FLOAT64_KERNELS) or node.op_type in _ALONE:
                step = self._standard_step(node, label)
            else:
                batch.append(([self._as_dtype(node)], {}, outputs, label))
                pending.update(outputs)
                continue
            flush()
            env = {t: self._constants[t] for t in inputs}
            step.run(env)
            for t in outputs:
                self._constants[t] = self._const(env[t])
        flush()
        return kept, kept_ops

    def _is_parameter_quantizer(self, node: onnx.NodeProto, i: int, ops: Mapping[int, CustomOp]) -> bool:
        """In float64 mode: a Quant whose every input is a float32 constant of the model (a weight quantizer, whose
        output is a parameter: see :class:`~custom_ops.float64_ops.Float32Parameters`)."""
        return (self.dtype == np.float64 and i in ops and node.op_type in PARAMETER_QUANTIZERS
                and len(node.output) == 1 and all(node.input) and all(t in self._float32 for t in node.input))

    def _standard_step(self, node: onnx.NodeProto, label: str) -> Step:
        """A step running one standard node on constant inputs (constant folding)."""
        if self.dtype == np.float64 and node.op_type in FLOAT64_KERNELS:
            return KernelStep(node, Float64Op(node), label, "no double kernel in onnxruntime")
        if node.op_type in _ALONE:
            return NodeSessionStep(node, label, self._opset_imports, self.threads)
        node = self._as_dtype(node)
        consts = {t: self._constants[t] for t in node_inputs(node)}
        return RegionStep([node], [], [t for t in node.output if t], consts, self._opset_imports, self._functions,
                          [label], self.threads)

    def _as_dtype(self, node: onnx.NodeProto) -> onnx.NodeProto:
        """``node`` as it runs in this executor's dtype: in float64 mode a Cast to float32 casts to float64 and a
        ConstantOfShape with a float value makes float64."""
        if self.dtype != np.float64 or node.op_type not in ("Cast", "ConstantOfShape"):
            return node
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        for a in copy.attribute:
            if a.name == "to" and a.i in _FLOAT_TYPES:
                a.i = onnx.TensorProto.DOUBLE
            elif a.name == "value" and a.t.data_type in _FLOAT_TYPES:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
        return copy

    def _static_shapes(self) -> dict[str, tuple[int | None, ...]]:
        """Shapes known before running: value_info, graph inputs/outputs, constants, and onnx shape inference
        with shape-preserving custom ops seen as Identity and other custom ops through their ``infer_shapes``."""
        shapes: dict[str, tuple[int | None, ...]] = {}
        types: dict[str, int] = {}
        for vi in self._value_info:
            dims = value_info_dims(vi)
            if dims is not None:
                shapes[vi.name] = dims
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types[vi.name] = vi.type.tensor_type.elem_type
        for name, value in self._constants.items():
            shapes[name] = tuple(value.shape)
            types[name] = helper.np_dtype_to_tensor_dtype(value.dtype)
        for name, tensor in self._sparse.items():
            shapes[name] = tuple(int(d) for d in tensor.shape)
            types[name] = helper.np_dtype_to_tensor_dtype(self._float(tensor.kernel.dtype))
        small = {n: v for n, v in self._constants.items() if v.size <= 64}
        outputs = [t for n in self._nodes for t in n.output if t]
        for _ in range(4):
            known = len(shapes)
            if all(t in shapes for t in outputs):  # nothing left to infer
                break
            self._infer_round(shapes, types, small)
            if len(shapes) == known:
                break
        self._types = types
        return shapes

    def _infer_round(self, shapes: dict[str, tuple[int | None, ...]], types: dict[str, int],
                     small: dict[str, np.ndarray]) -> None:
        nodes = []
        for i, node in enumerate(self._nodes):
            if i not in self._ops:
                nodes.append(node)
            elif node.op_type in _SHAPE_PRESERVING and node.input and node.input[0]:
                nodes.append(helper.make_node("Identity", [node.input[0]], [node.output[0]]))
            elif any(t not in shapes for t in node.output if t):
                try:
                    out = self._ops[i].infer_shapes([shapes.get(t) for t in node.input],
                                                    [self._constants.get(t) for t in node.input])
                except Exception:  # noqa: BLE001 - static shapes are a best effort
                    out = []
                for t, s in zip(node.output, out):
                    if t and s is not None:
                        shapes[t] = tuple(s)
        float_type = helper.np_dtype_to_tensor_dtype(self.dtype)
        inputs = [helper.make_tensor_value_info(n, types.get(n, float_type), list(s))
                  for n, s in shapes.items() if n not in small]
        graph = helper.make_graph(nodes, "shapes", inputs, [], [numpy_helper.from_array(v, n)
                                                                for n, v in small.items()])
        model = fix_ir_version(helper.make_model(graph, opset_imports=list(self._opset_imports)))
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception as exc:  # noqa: BLE001
            log.debug("shape inference failed: %s", exc)
            return
        for vi in inferred.graph.value_info:
            dims = value_info_dims(vi)
            if dims is not None and vi.name not in shapes:
                shapes[vi.name] = dims
                types[vi.name] = vi.type.tensor_type.elem_type

    def _classify(self) -> tuple[dict[int, Lowering], dict[int, tuple[Kernel | None, str]]]:
        """Lowerings for the custom nodes that have one; for the nodes that run outside the regions, their kernel
        (None: a session of their own) and why."""
        ctx = self._lowering_context(self._shapes)
        lowered: dict[int, Lowering] = {}
        kernels: dict[int, tuple[Kernel | None, str]] = {}
        for i, node in enumerate(self._nodes):
            if i in self._ops:
                if not self.lower:
                    kernels[i] = (self._ops[i], "lowering disabled")
                    continue
                try:
                    lowered[i] = lower_node(node, self._ops[i], ctx)
                except NotLowerable as exc:
                    kernels[i] = (self._ops[i], str(exc))
            elif self.dtype == np.float64 and node.op_type in FLOAT64_KERNELS:
                kernels[i] = (Float64Op(node), "no double kernel in onnxruntime")
            elif node.op_type in _ALONE:
                kernels[i] = (None, "as qonnx runs it")
        return lowered, kernels

    # -- plans ----------------------------------------------------------------------------------------------
    def _batch0(self) -> int:
        shape = self._input_shapes.get(self._inputs[0].name) if self._inputs else None
        return int(shape[0]) if shape and shape[0] else 1

    def _plan(self, batched: bool, return_all: bool | str, wanted: tuple[str, ...] | None = None) -> Plan:
        key = (batched, return_all, wanted)
        if key not in self._plans:
            self._plans[key] = self._build_plan(batched, return_all, wanted)
        return self._plans[key]

    def _live_nodes(self, return_all: bool, wanted: Sequence[str] | None = None) -> list[int]:
        """Indices of the nodes that contribute to a graph output, or to ``wanted`` (all of them for
        ``return_all``)."""
        if return_all:
            return list(range(len(self._nodes)))
        needed = set(self._outputs if wanted is None else wanted)
        live: list[int] = []
        for i in range(len(self._nodes) - 1, -1, -1):
            if any(t in needed for t in self._nodes[i].output):
                live.append(i)
                needed.update(node_inputs(self._nodes[i]))
        return live[::-1]

    def _build_plan(self, batched: bool, return_all: bool | str, wanted: tuple[str, ...] | None = None) -> Plan:
        """Alternate between the largest set of region nodes that waits for no pending kernel node (one region)
        and the kernel nodes that wait for no pending region node, in topological order, until all are placed.
        A fused Im2Col → MatMul pair is one lowered node (the Im2Col's index) that produces the MatMul's outputs;
        where the Im2Col's output is needed too (``return_all``, other readers) the Im2Col still runs and the
        MatMul runs as the Conv on the Im2Col's input. ``wanted``: the tensors asked for instead of the graph
        outputs."""
        outputs = set(self._outputs if wanted is None else wanted)
        fused: dict[int, tuple[int, Lowering]] = {}
        readers: Counter[str] = Counter()
        if return_all == _ALL_BUT_WINDOWS and self._fused:  # the windows are not wanted, even as graph outputs
            readers.update(t for n in self._nodes for t in set(node_inputs(n)))
        for i, (j, lowering, private) in self._fused.items():
            if return_all == _ALL_BUT_WINDOWS:
                private = readers[self._nodes[i].output[0]] == 1  # only the fused MatMul reads the window
            if wanted is not None and self._nodes[i].output[0] in outputs:
                private = False  # the window itself is asked for
            if private and return_all is not True:
                fused[i] = (j, lowering)  # the pair is one node in the Im2Col's place
            else:
                fused[j] = (j, lowering)  # the Im2Col runs for its output; the MatMul runs as the Conv
        absorbed = {j for i, (j, _) in fused.items() if j != i}
        live = [i for i in self._live_nodes(bool(return_all), wanted) if i not in absorbed]
        outs = {i: self._nodes[fused[i][0] if i in fused else i].output for i in live}
        producer = {t: i for i in live for t in outs[i] if t}
        deps = {i: {producer[t] for t in node_inputs(self._nodes[i]) if t in producer} for i in live}
        steps: list[Step] = []
        remaining = live
        while remaining:
            for want_kernel in (False, True):
                blocked: set[int] = set()
                taken: list[int] = []
                for i in remaining:
                    if (i in self._kernels and i not in fused) == want_kernel and not deps[i] & blocked:
                        taken.append(i)
                    else:
                        blocked.add(i)
                if not taken:
                    continue
                if want_kernel:
                    steps += [self._outside_step(i) for i in taken]
                else:
                    steps.append(self._region(taken, batched, fused))
                remaining = [i for i in remaining if i in blocked]
        # a region returns the graph tensors it computes that a later step or the caller needs
        # onnxruntime cannot hand int4/uint4 tensors (QDQ models) to numpy: they are returned only where a later step
        # reads them
        skip = {t for t, elem in self._types.items() if elem in _NO_NUMPY_TYPES} if return_all else set()
        needed_later = set(outputs)
        for step in reversed(steps):
            if isinstance(step, RegionStep):
                step.outputs = [t for t in step.produced if (return_all and t not in skip) or t in needed_later]
            needed_later.update(step.inputs)
        return Plan([s for s in steps if not isinstance(s, RegionStep) or s.outputs],
                    keep=None if return_all else outputs)

    def _outside_step(self, i: int) -> Step:
        node, label = self._as_dtype(self._nodes[i]), node_label(self._nodes[i], i)
        for t in node_inputs(node):  # a kernel reads its inputs from the environment: a compact weight goes dense
            if t in self._sparse:
                self._dense(t)
        kernel, reason = self._kernels[i]
        if kernel is None:
            return NodeSessionStep(node, label, self._opset_imports, self.threads)
        return KernelStep(node, kernel, label, reason, upcast=self.dtype == np.float64)

    def _region(self, members: list[int], batched: bool, fused: Mapping[int, tuple[int, Lowering]] | None = None
                ) -> RegionStep:
        fused = fused or {}
        nodes: list[onnx.NodeProto] = []
        constants: dict[str, np.ndarray] = {}
        for i in members:
            lowering = fused[i][1] if i in fused else self._lowered.get(i)
            if lowering is not None:
                nodes += lowering.nodes
                constants.update(lowering.constants)
                continue
            node = self._as_dtype(self._nodes[i])
            if batched and node.op_type == "Reshape":
                node = self._batch_reshape(node, constants)
            nodes.append(node)
        produced = {t for n in nodes for t in n.output if t}
        inputs: list[str] = []
        for n in nodes:
            for t in node_inputs(n):
                if t in produced or t in constants or t in inputs:
                    continue
                if t in self._constants or t in self._sparse:
                    constants[t] = self._dense(t)
                else:
                    inputs.append(t)
        graph_tensors = [t for i in members for t in self._nodes[fused[i][0] if i in fused else i].output if t]
        labels = [node_label(self._nodes[i], i) + ("" if i not in fused else " as Conv" if fused[i][0] == i
                                                   else f" + {node_label(self._nodes[fused[i][0]], fused[i][0])} as Conv")
                  for i in members]
        return RegionStep(nodes, inputs, graph_tensors, constants, self._opset_imports, self._functions, labels,
                          self.threads)

    def _batch_reshape(self, node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> onnx.NodeProto:
        """A Reshape with a constant shape that hard-codes the batch dim b0, rewritten to ``[-1, d1, ...]`` when
        its static input and output shapes both keep b0 on axis 0 (row-major: then input row i is output row i,
        for any batch)."""
        if len(node.input) < 2 or node.input[1] not in self._constants:
            return node
        shape, b0 = self._constants[node.input[1]], self._batch0()
        in_shape, out_shape = self._shapes.get(node.input[0]), self._shapes.get(node.output[0])
        if (shape.ndim != 1 or shape.size == 0 or int(shape[0]) != b0 or not in_shape or not out_shape
                or in_shape[0] != b0 or out_shape[0] != b0 or any(d is None for d in out_shape)):
            return node
        allowzero = next((a.i for a in node.attribute if a.name == "allowzero"), 0)
        if not allowzero and 0 in out_shape[1:]:
            return node
        name = self._fresh(f"{node.input[1]}__batch")
        constants[name] = np.array([-1, *out_shape[1:]], dtype=shape.dtype)
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[1] = name
        return copy

    # -- running --------------------------------------------------------------------------------------------
    def _check_inputs(self, inputs: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int | None]:
        """The user's inputs as arrays of the model's dtypes, and the batch size if it is not the model's b0."""
        for name in inputs:
            if name not in self._input_shapes:
                if name in self._constants or name in self._sparse:
                    raise GraphError("is an initializer of the model, not a data input", tensor=name)
                raise GraphError(f"is not an input of the model (inputs: {self.input_names})", tensor=name)
        missing = [name for name in self._input_shapes if name not in inputs]
        if missing:
            raise GraphError(f"missing model input(s) {missing}", tensor=missing[0])
        arrays: dict[str, np.ndarray] = {}
        batched = False
        for name, shape in self._input_shapes.items():
            arr, want = np.asarray(inputs[name]), self._input_dtypes[name]
            if arr.dtype != want:
                if not (want == np.float64 and arr.dtype.kind == "f"):
                    raise GraphError(f"has dtype {arr.dtype}, the model expects {want}", tensor=name)
                arr = arr.astype(np.float64)
            if shape is not None:
                if arr.ndim != len(shape) or any(d is not None and a != d for a, d in zip(arr.shape[1:], shape[1:])):
                    raise GraphError(f"has shape {arr.shape}, the model expects {_shape_text(shape)}", tensor=name)
                if shape[0] is not None and arr.shape[0] != shape[0]:
                    if arr.shape[0] == 0 or arr.shape[0] % shape[0]:
                        raise GraphError(f"has batch size {arr.shape[0]}, not a multiple of the model's "
                                         f"{shape[0]} (shape {_shape_text(shape)})", tensor=name)
                    batched = True
            arrays[name] = np.ascontiguousarray(arr)
        if not batched:
            return arrays, None
        b0 = self._batch0()
        leading = {a.shape[0] if a.ndim else None for a in arrays.values()}
        fixed = all(s is not None and len(s) > 0 and s[0] == b0 for s in self._input_shapes.values())
        if len(leading) != 1 or not fixed:
            raise GraphError(f"a batch needs every input to have the model's batch dim {b0} replaced by the same "
                             f"N; got leading dims {sorted(leading, key=str)}", tensor=self._inputs[0].name)
        return arrays, int(leading.pop())

    def _execute(self, arrays: dict[str, np.ndarray], batched: bool, return_all: bool | str,
                 wanted: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        plan = self._plan(batched, return_all, wanted)  # first: planning may make a compact weight dense (_dense)
        env: dict[str, np.ndarray] = dict(self._constants)
        env.update(arrays)
        plan.execute(env)
        if return_all:
            return env
        return {name: env[name] for name in (self._outputs if wanted is None else wanted)}

    def _batch_ok(self, result: Mapping[str, np.ndarray], batch: int) -> bool:
        """Every output that has b0 on axis 0 statically has N there."""
        for name in self._outputs:
            static = self._shapes.get(name)
            if static and static[0] == self._batch0() and name not in self._constants:
                if result[name].ndim == 0 or result[name].shape[0] != batch:
                    return False
        return True

    def _run_chunks(self, arrays: dict[str, np.ndarray], batch: int, return_all: bool | str,
                    wanted: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        b0 = self._batch0()
        chunks = [{n: a[k:k + b0] for n, a in arrays.items()} for k in range(0, batch, b0)]
        parts = [self._execute(c, batched=False, return_all=return_all, wanted=wanted) for c in chunks]
        return {name: self._constants[name] if name in self._constants
                else np.concatenate([p[name] for p in parts], axis=0) for name in parts[0]}


def _shape_text(shape: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def execute(model: Any, inputs: Mapping[str, np.ndarray], return_all: bool = False, **kwargs: Any
            ) -> dict[str, np.ndarray]:
    """One-shot convenience: ``Executor(model, **kwargs).run(inputs, return_all)``. Build an :class:`Executor`
    once to run a model repeatedly."""
    return Executor(model, **kwargs).run(inputs, return_all=return_all)
