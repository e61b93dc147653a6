"""The executor's building blocks: loading a model, node helpers, and the kinds of plan step.

A plan (:class:`Plan`) is a list of steps run in order over one environment dict {tensor name: array}:
:class:`RegionStep` runs a set of standard nodes as one onnxruntime session, :class:`KernelStep` runs one node by
a numpy kernel, :class:`NodeSessionStep` runs one standard node alone, as qonnx does. :func:`session_options`
holds the onnxruntime settings that make a multi-node session compute exactly what qonnx's one-session-per-node
execution computes (see :mod:`custom_ops.executor`).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from finnlite.core.compat import IR_VERSION, fix_ir_version
from finnlite.core.errors import FinnliteError, ModelLoadError, OpError


def as_model_proto(model: Any) -> onnx.ModelProto:
    """A private copy of ``model`` as an ``onnx.ModelProto``: from a ModelProto, a path, serialized bytes, an object
    with ``to_proto()`` (finnlite's Model) or a qonnx ModelWrapper (``.model``)."""
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        return proto
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise ModelLoadError("no such model file", file=str(path))
        try:
            return onnx.load(str(path))
        except Exception as exc:  # noqa: BLE001 - any parse failure is a load error
            raise ModelLoadError(f"cannot read ONNX model: {exc}", file=str(path)) from exc
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.ModelProto.FromString(bytes(model))
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"cannot parse ONNX model bytes: {exc}") from exc
    if hasattr(model, "to_proto"):
        return as_model_proto(model.to_proto())
    if isinstance(getattr(model, "model", None), onnx.ModelProto):
        return as_model_proto(model.model)
    raise ModelLoadError(f"cannot execute a {type(model).__name__}: expected an onnx.ModelProto, a path, bytes, "
                         "an object with to_proto() or a qonnx ModelWrapper")


def node_label(node: onnx.NodeProto, index: int) -> str:
    """The node's name, or ``op_type#index`` for an unnamed node (for messages)."""
    return node.name or f"{node.op_type}#{index}"


def subgraph_refs(node: onnx.NodeProto) -> list[str]:
    """Outer-scope tensors that the subgraphs (If/Loop/Scan bodies) of ``node`` read."""
    refs: list[str] = []
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            for sub in g.node:
                refs += [t for t in list(sub.input) + subgraph_refs(sub) if t and t not in defined]
                defined.update(sub.output)
    return refs


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """Every tensor ``node`` reads: its inputs (without the empty optional ones) and its subgraphs' outer refs."""
    return [t for t in node.input if t] + subgraph_refs(node)


def unique_node_names(nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` with no name used twice: onnxruntime refuses such a graph, and a node's name does not change what
    it computes. A repeated name is given a suffix in a copy of its node (the nodes given are not changed)."""
    names = [n.name for n in nodes]
    if len(set(names)) == len(names):
        return list(nodes)
    taken = set(names)
    seen: set[str] = set()
    out = []
    for node in nodes:
        if node.name and node.name in seen:
            k = 1
            while f"{node.name}__{k}" in taken:
                k += 1
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{node.name}__{k}"
            taken.add(copy.name)
            node = copy
        seen.add(node.name)
        out.append(node)
    return out


def value_info_dims(vi: onnx.ValueInfoProto) -> tuple[int | None, ...] | None:
    """The shape of a ValueInfo (None for a symbolic dim), or None without a shape."""
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim)


# -- onnxruntime ----------------------------------------------------------------------------------------------
def session_options(threads: int | None = None) -> Any:
    """The onnxruntime options of every region: graph optimizations off and no prepacking of constant weights —
    the settings measured bit-exact to per-node execution (see :mod:`custom_ops.executor`); ``threads`` intra-op
    threads (onnxruntime's default when None — keep it for bit-exactness with qonnx, which uses the default)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # prepacked constant weights take another MLAS path for Gemm/MatMul, with other rounding
    opts.add_session_config_entry("session.disable_prepacking", "1")
    # memory only (results unchanged): no pre-planned block for all of a run's intermediates, which the arena keeps
    opts.enable_mem_pattern = False
    # memory only: run the nodes in the order given (a topological order by node index) rather than onnxruntime's
    # default depth-first order, which can run every weight quantizer of a network before the first layer and keep
    # all the quantized weights alive at once
    opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    no_spinning(opts)
    shared_arena(opts)
    if threads is not None:
        opts.intra_op_num_threads = threads
    return opts


def no_spinning(opts: Any) -> Any:
    """Intra-op threads that sleep instead of spinning when idle. Scheduling only (results are unchanged), but it
    matters: a plan alternates onnxruntime sessions with numpy kernels, and spinning pool threads of every session
    compete with those kernels for the cores."""
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


#: whether the process-wide arena is registered with onnxruntime (None: not tried yet)
_SHARED_ARENA: bool | None = None


def shared_arena(opts: Any) -> Any:
    """Let sessions created with ``opts`` allocate from one process-wide onnxruntime CPU arena instead of one arena
    each. Memory only (results are unchanged): the verifier builds a new small session for every check, and with a
    private arena each one's first run allocates and first-touches all its intermediates anew (on a virtual
    machine that hands freed pages back to the host, those page faults can cost more than the run). The arena keeps
    what it has grown to (the largest set of intermediates one run needed) for the life of the process. If onnxruntime refuses the registration, sessions
    keep their own arenas."""
    global _SHARED_ARENA
    if _SHARED_ARENA is None:
        import onnxruntime as ort

        try:
            info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            # grow by what is asked for, not to the next power of two (less memory, same speed here)
            ort.create_and_register_allocator(info, ort.OrtArenaCfg({"arena_extend_strategy": 1}))
            _SHARED_ARENA = True
        except Exception:  # noqa: BLE001 - an onnxruntime without the API: private arenas
            _SHARED_ARENA = False
    if _SHARED_ARENA:
        opts.add_session_config_entry("session.use_env_allocators", "1")
    return opts


def release_arena() -> None:
    """Hand the unused memory of the process-wide arena and of the C heap back to the system.

    The arena (:func:`shared_arena`) keeps what it grew to; arrays a session returned live in it until they are
    dropped. After a phase that held many of them (the verifier's cached tensor values), its free blocks would
    stay resident beside what the next phase allocates with numpy. onnxruntime shrinks an arena at the end of a
    run given ``memory.enable_memory_arena_shrinkage``: here, a run of a one-element Identity session. numpy's
    arrays come from the C heap, which keeps freed blocks too (glibc serves large ones from the heap once it has
    freed one of that size): :func:`_trim_heap` returns them."""
    if _SHARED_ARENA:
        _shrink_arena()
    _trim_heap()


def _trim_heap() -> None:
    """glibc's ``malloc_trim(0)``: the C heap's free memory back to the system (nothing on another C library)."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _shrink_arena() -> None:
    import onnxruntime as ort

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "finnlite_release", [x], [y])
    model = fix_ir_version(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), IR_VERSION)
    run = ort.RunOptions()
    run.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    make_session(model).run(None, {"x": np.zeros(1, np.float32)}, run)


def make_session(model: onnx.ModelProto, threads: int | None = None) -> Any:
    """An onnxruntime CPU session for a region model, with :func:`session_options` (looked up at call time, so a
    study can swap it)."""
    import onnxruntime as ort

    opts = session_options(threads)
    return ort.InferenceSession(model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])


# -- steps ----------------------------------------------------------------------------------------------------
#: constants with at least this many elements are fed to a region's session at each run (RegionStep.run)
FEED_ELEMENTS = 1 << 16

class RegionStep:
    """Standard nodes run as one onnxruntime session, created on first run and reused.

    ``inputs`` are fed from the environment, ``constants`` become initializers, ``produced`` are the graph tensors
    the region computes and ``outputs`` the subset it returns (the planner trims it to what is needed later)."""

    def __init__(self, nodes: list[onnx.NodeProto], inputs: list[str], produced: list[str],
                 constants: dict[str, np.ndarray], opsets: Sequence[onnx.OperatorSetIdProto],
                 functions: Sequence[onnx.FunctionProto], labels: list[str], threads: int | None) -> None:
        self.nodes, self.inputs, self.produced, self.outputs = nodes, inputs, produced, list(produced)
        self.constants, self.opsets, self.functions = constants, opsets, functions
        self.labels, self.threads = labels, threads
        self._session: Any = None
        self._fed: dict[str, np.ndarray] = {}

    def describe(self) -> str:
        head = ", ".join(self.labels[:3]) + (", ..." if len(self.labels) > 3 else "")
        return f"onnxruntime region: {len(self.labels)} nodes ({len(self.nodes)} after lowering): {head}"

    def model(self, feeds: Mapping[str, np.ndarray], feed_large: bool = False) -> onnx.ModelProto:
        """The region as a model, its inputs typed after ``feeds`` with unknown dims (any batch size runs). With
        ``feed_large``, constants of :data:`FEED_ELEMENTS` elements or more are graph inputs of their static
        shape instead of initializers (see :meth:`run`)."""
        inputs = []
        for name, value in self.large_constants().items() if feed_large else ():
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                                        list(value.shape)))
        for name in self.inputs:
            arr = feeds[name]
            vi = helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), None)
            dims = vi.type.tensor_type.shape
            for _ in range(arr.ndim):
                dims.dim.add()
            inputs.append(vi)
        outputs = [onnx.ValueInfoProto(name=name) for name in self.outputs]
        large = self.large_constants() if feed_large else {}
        inits = [numpy_helper.from_array(value, name) for name, value in self.constants.items() if name not in large]
        graph = helper.make_graph(unique_node_names(self.nodes), "finnlite_region", inputs, outputs, inits)
        model = helper.make_model(graph, opset_imports=list(self.opsets), functions=list(self.functions))
        return fix_ir_version(model, IR_VERSION)

    def large_constants(self) -> dict[str, np.ndarray]:
        """The constants fed to the session at each run rather than serialized into its model."""
        return {name: value for name, value in self.constants.items()
                if value.size >= FEED_ELEMENTS and value.dtype.kind in "fiub"}

    def run(self, env: dict[str, np.ndarray]) -> None:
        """Run the session on ``env`` (created at the first run). Large constants (weight matrices) are fed as
        inputs: onnxruntime reads the numpy arrays in place, where an initializer would be serialized into the
        region's model and copied into the session (the verifier
        builds executors for many regions of it). With graph optimizations and prepacking off, a weight computes
        the same whether it is an initializer or an input (qonnx feeds every weight as an input)."""
        feeds = {name: env[name] for name in self.inputs}
        if self._session is None:
            self._fed = self.large_constants()
            try:
                self._session = make_session(self.model(feeds, feed_large=True), self.threads)
            except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
                raise OpError(f"onnxruntime cannot build a session for {self.describe()}: {exc}",
                              node=self.labels[0]) from exc
        feeds.update(self._fed)
        try:
            results = self._session.run(self.outputs, feeds)
        except Exception as exc:  # noqa: BLE001
            raise OpError(f"onnxruntime failed in {self.describe()}: {exc}", node=self.labels[0]) from exc
        env.update(zip(self.outputs, results))


class NodeSessionStep:
    """One standard node in a session of its own with onnxruntime's default options and the static shapes of its
    inputs — exactly how qonnx's ``execute_node`` runs a standard node. Used for the pooling ops, which onnxruntime
    turns into NCHWc kernels in such a session (``ORT_ENABLE_ALL`` with known shapes), with results that can differ
    from the plain kernel's (a max over -0.0 and +0.0). One session per input shape."""

    def __init__(self, node: onnx.NodeProto, label: str, opsets: Sequence[onnx.OperatorSetIdProto],
                 threads: int | None) -> None:
        self.node, self.label, self.opsets, self.threads = node, label, opsets, threads
        self.inputs = node_inputs(node)
        self.outputs = [t for t in node.output if t]
        self._sessions: dict[tuple, Any] = {}

    def describe(self) -> str:
        return f"own session: {self.label} ({self.node.op_type}, as qonnx runs it)"

    def run(self, env: dict[str, np.ndarray]) -> None:
        import onnxruntime as ort

        feeds = {name: env[name] for name in self.inputs}
        key = tuple((name, a.dtype.str, a.shape) for name, a in feeds.items())
        session = self._sessions.get(key)
        if session is None:
            inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                      for n, a in feeds.items()]
            graph = helper.make_graph([self.node], "finnlite_node", inputs,
                                      [onnx.ValueInfoProto(name=t) for t in self.outputs])
            model = fix_ir_version(helper.make_model(graph, opset_imports=list(self.opsets)), IR_VERSION)
            opts = ort.SessionOptions()  # onnxruntime's defaults, as qonnx: ORT_ENABLE_ALL
            opts.log_severity_level = 3
            no_spinning(opts)
            if self.threads is not None:
                opts.intra_op_num_threads = self.threads
            try:
                session = ort.InferenceSession(model.SerializeToString(), sess_options=opts,
                                               providers=["CPUExecutionProvider"])
            except Exception as exc:  # noqa: BLE001
                raise OpError(f"onnxruntime cannot build a session for {self.node.op_type}: {exc}",
                              node=self.label) from exc
            self._sessions[key] = session
        try:
            results = session.run(self.outputs, feeds)
        except Exception as exc:  # noqa: BLE001
            raise OpError(f"onnxruntime failed in {self.node.op_type}: {exc}", node=self.label) from exc
        env.update(zip(self.outputs, results))


class Kernel(Protocol):
    """What a kernel step runs: a CustomOp, or a numpy kernel for a standard op."""

    def execute(self, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]: ...


class KernelStep:
    """One node run by a numpy kernel; ``reason`` says why it is not in a region. With ``upcast`` (float64 mode)
    a float output of lower precision is cast to float64."""

    def __init__(self, node: onnx.NodeProto, kernel: Kernel, label: str, reason: str, upcast: bool = False) -> None:
        self.node, self.kernel, self.label, self.reason, self.upcast = node, kernel, label, reason, upcast
        self.inputs = node_inputs(node)
        self.outputs = [t for t in node.output if t]

    def describe(self) -> str:
        return f"kernel: {self.label} ({self.node.op_type}; {self.reason})"

    def run(self, env: dict[str, np.ndarray]) -> None:
        args = [env[t] if t else None for t in self.node.input]
        try:
            results = self.kernel.execute(args)
        except FinnliteError:
            raise
        except Exception as exc:  # noqa: BLE001 - a kernel failing on its inputs
            raise OpError(f"{self.node.op_type} kernel failed: {exc}", node=self.label) from exc
        for name, value in zip(self.node.output, results):
            if name:
                value = np.asarray(value)
                if self.upcast and value.dtype.kind == "f" and value.dtype != np.float64:
                    value = value.astype(np.float64)
                env[name] = value


Step = RegionStep | KernelStep | NodeSessionStep


class Plan:
    """Steps in execution order. With ``keep`` (the tensors the caller wants), a tensor leaves the environment
    right after the last step that reads it (or the step that makes it, if none does): a run then holds the
    tensors still needed, not every activation of the network. Without ``keep`` every tensor stays."""

    def __init__(self, steps: list[Step], keep: set[str] | None = None) -> None:
        self.steps = steps
        self._drop: list[list[str]] | None = None
        if keep is not None:
            last: dict[str, int] = {}
            for i, step in enumerate(steps):
                for t in step.outputs:
                    last.setdefault(t, i)
                for t in step.inputs:
                    last[t] = i
            self._drop = [[] for _ in steps]
            for t, i in last.items():
                if t not in keep:
                    self._drop[i].append(t)

    def execute(self, env: dict[str, np.ndarray]) -> None:
        """Run the steps on ``env``."""
        for i, step in enumerate(self.steps):
            step.run(env)
            if self._drop is not None:
                for t in self._drop[i]:
                    env.pop(t, None)
