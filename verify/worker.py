"""A verification worker in a child process: per-pass checks that run beside the passes, not between them.

Why a process: the checks are mostly Python (finding the changed region, building its executor, comparing
tensors), and so are the passes, so a worker *thread* mostly waits for the interpreter lock: on resnet18 the
passes took 0.51 s of CPU and the checks 0.41 s, and the run with the checks on a thread took 0.80 s, hardly less
than the sum. A forked child has its own interpreter and runs on the second core.

How versions travel: the child is forked when verification starts, so it inherits the reference values and the
first version without copying them. Each later version is sent as its graph in plain tables (values, nodes,
attributes, annotations; an ONNX proto for what the tables cannot carry) in which every initializer is a *key*
(:meth:`VersionSender.encode`), followed by the bytes of the initializers the child has not seen. An initializer
finnlite cannot change in place
(:func:`finnlite.tensors.is_immutable`) is recognized by identity and sent once; a writable one is sent again when
its bytes (crc32) change. The child (:class:`VersionReceiver`) puts the same tensor object behind the same key in
every version, so the verifier fingerprints it by identity as it does in-process; tensor-valued attributes are
interned by content for the same reason. A thread in the child reads the pipe as messages arrive, so that the
sender never waits for a check to finish.

:class:`Worker` forks, carries requests to the child and replies back, in order, and stops or kills it. The child
never returns into the caller's code: it leaves with ``os._exit`` (no exit handlers, no flushing of inherited
buffers), when asked, when the parent closes the pipe, or when it dies. It writes nothing to the terminal: log
records are sent back with the replies and the parent logs them (:func:`replay_logs`).
"""

from __future__ import annotations

import fcntl
import gc
import hashlib
import logging
import os
import pickle
import queue
import select
import signal
import struct
import sys
import threading
import traceback
import weakref
from typing import Any, Callable, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from finnlite.io import to_proto_without
from finnlite.memory import status_bytes
from finnlite.model import Model, freeze
from finnlite.tensors import DepthwiseWeight, content_crc, is_immutable

__all__ = ["process_supported", "VersionSender", "VersionReceiver", "Worker", "RemoteError"]

log = logging.getLogger(__name__)

#: the location a stand-in initializer names: this prefix and the key of its tensor
_STAND_IN = "finnlite-worker:"

#: fcntl's F_SETPIPE_SZ (Linux): set a pipe's buffer size
_F_SETPIPE_SZ = 1031


def process_supported() -> bool:
    """True where a forked worker is safe and useful: Linux (fork after numpy/onnxruntime are loaded is safe
    there; macOS's system libraries are not fork-safe) with at least two CPUs this process may use."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return cpus >= 2


class RemoteError(RuntimeError):
    """An unexpected error inside the worker process, with its traceback text (the original exception could not
    be carried over)."""


# -- versions ------------------------------------------------------------------------------------------------------

class VersionSender:
    """The parent's side: which tensors the child holds (by key), and each version as a message plus buffers."""

    def __init__(self) -> None:
        self._next = 0
        #: id(tensor) -> (tensor, key): the tensors of the last version encoded (held, so no id is reused)
        self._known: dict[int, tuple[Any, int]] = {}
        #: id(writable tensor) -> (tensor, content_crc, key): the copy sent for it, while its contents stay
        self._writable: dict[int, tuple[Any, int, int]] = {}

    def register(self, model: Model) -> dict[int, Any]:
        """Give a key to each initializer of ``model``, a version the child will inherit by forking (nothing is
        sent); returns {key: tensor} for the child's :class:`VersionReceiver`."""
        store = {}
        known: dict[int, tuple[Any, int]] = {}
        writable: dict[int, tuple[Any, int, int]] = {}
        for value in model.graph.initializers.values():
            t = value.const_value
            if t is None:
                continue
            if is_immutable(t):
                hit = known.get(id(t))
                if hit is None:
                    hit = known[id(t)] = (t, self._new_key())
                store[hit[1]] = t
            elif id(t) not in writable:
                writable[id(t)] = (t, content_crc(t.numpy()), self._new_key())
                store[writable[id(t)][2]] = t
        self._known, self._writable = known, writable
        return store

    def _new_key(self) -> int:
        self._next += 1
        return self._next

    def encode(self, model: Model) -> tuple[tuple[tuple[str, bytes], list[tuple]], list[memoryview]]:
        """``model`` as ((its graph with keys for initializers: :func:`_graph_message`), the new tensors'
        descriptions) and the new tensors' buffers. The model is left as it was."""
        known: dict[int, tuple[Any, int]] = {}
        writable: dict[int, tuple[Any, int, int]] = {}
        new: list[tuple] = []
        buffers: list[memoryview] = []
        keys: dict[str, int] = {}
        for name, value in model.graph.initializers.items():
            t = value.const_value
            if t is None:
                continue
            key = self._key(t, name, known, writable, new, buffers)
            keys[name] = key
        self._known, self._writable = known, writable
        return (_graph_message(model, keys), new), buffers

    def _key(self, t: Any, name: str, known: dict, writable: dict, new: list, buffers: list) -> int:
        if is_immutable(t):  # by identity
            hit = known.get(id(t)) or self._known.get(id(t))
            if hit is not None and hit[0] is t:
                known[id(t)] = hit
                return hit[1]
            key = self._new_key()
            known[id(t)] = (t, key)
            new.append(_describe(key, t, name, buffers))
            return key
        arr = np.asarray(t.numpy())  # writable: by identity and contents
        crc = content_crc(arr)
        old = writable.get(id(t)) or self._writable.get(id(t))
        if old is not None and old[0] is t and old[1] == crc:
            writable[id(t)] = old
            return old[2]
        key = self._new_key()
        writable[id(t)] = (t, crc, key)
        # a copy: the bytes leave later, and the array may change meanwhile
        new.append(_describe(key, t, name, buffers, np.array(arr)))
        return key


def _describe(key: int, t: Any, name: str, buffers: list[memoryview], arr: np.ndarray | None = None) -> tuple:
    """(key, kind, name, dtype, shape, extra) of a tensor to send (named after its initializer); its bytes appended
    to ``buffers`` (views of immutable memory: ``arr``, a private copy of a writable tensor's array, or the tensor's
    own read-only data)."""
    if isinstance(t, DepthwiseWeight):
        kernel = np.ascontiguousarray(t.kernel)
        buffers.append(memoryview(kernel).cast("B"))
        return (key, "depthwise", name, kernel.dtype, kernel.shape, None)
    arr = np.asarray(t.numpy()) if arr is None else arr
    if arr.dtype.hasobject:
        return (key, "pickle", name, t.dtype, arr.shape, pickle.dumps(arr))
    shape = arr.shape  # (np.ascontiguousarray makes a 0-d array 1-d)
    arr = np.ascontiguousarray(arr)
    buffers.append(memoryview(arr.reshape(-1).view(np.uint8)))
    return (key, "array", name, t.dtype, shape, arr.dtype)


_SIMPLE_ATTRS = {ir.AttributeType.INT, ir.AttributeType.FLOAT, ir.AttributeType.STRING, ir.AttributeType.INTS,
                 ir.AttributeType.FLOATS, ir.AttributeType.STRINGS}


def _graph_message(model: Model, keys: dict[str, int]) -> tuple[str, bytes]:
    """``model``'s structure as ``("compact", pickled tables)`` (:func:`_compact`), or as ``("proto", bytes)``
    (:func:`_graph_bytes`) for what the tables do not carry: functions, subgraph attributes, unpicklable
    annotations."""
    src = model.ir
    if not src.functions and not any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                                     for n in src.graph for a in n.attributes.values()):
        try:
            return "compact", pickle.dumps(_compact(src, keys), protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            log.debug("version sent as a proto: %s", exc)
    return "proto", _graph_bytes(model, keys)


def _dims(shape: ir.Shape | None) -> tuple | None:
    return None if shape is None else tuple(d if isinstance(d, int) else d.value for d in shape.dims)


def _compact(src: ir.Model, keys: dict[str, int]) -> tuple:
    """The model as tables of plain values (what :func:`verify.clone.clone_model` copies, but the nodes'
    ``metadata_props``: the checks never read them, and a streamlined MobileNet-v1 carries 3 MB of exact thresholds
    there): serializing a proto costs 4 ms for resnet18 and parsing it back 5 ms, these tables about 1 ms and 2 ms."""
    graph = src.graph
    index: dict[ir.Value, int] = {}
    values: list[tuple] = []

    def ref(v: ir.Value) -> int:
        i = index.get(v)
        if i is None:
            i = index[v] = len(values)
            values.append((v.name, v.type, _dims(v.shape), v.doc_string, dict(v.metadata_props) or None,
                           dict(v.meta) or None))
        return i

    inputs = [ref(v) for v in graph.inputs]
    inits = [(ref(v), keys.get(v.name)) for v in graph.initializers.values()]
    nodes = []
    for n in graph:
        attrs = [(a.name, a.type, a.value) if a.type in _SIMPLE_ATTRS else a for a in n.attributes.values()]
        nodes.append((n.domain, n.op_type, n.overload, n.name, n.version, n.doc_string,
                      [-1 if v is None else ref(v) for v in n.inputs], [ref(v) for v in n.outputs], attrs,
                      dict(n.meta) or None))
    outputs = [ref(v) for v in graph.outputs]
    head = (graph.name, graph.doc_string, dict(graph.opset_imports), dict(graph.metadata_props) or None,
            dict(graph.meta) or None)
    model = (src.ir_version, src.producer_name, src.producer_version, src.domain, src.model_version,
             src.doc_string, dict(src.metadata_props) or None)
    return model, head, values, inputs, inits, nodes, outputs


def _rebuild(tables: tuple, tensor: Callable[[int], Any]) -> Model:
    """The model :func:`_compact` described; ``tensor(key)``: the initializer tensor of a key."""
    model, head, values, inputs, inits, nodes, outputs = tables
    made = []
    for name, vtype, dims, doc, props, meta in values:
        v = ir.Value(name=name, type=vtype, shape=None if dims is None else ir.Shape(dims), doc_string=doc,
                     metadata_props=props)
        if meta:
            v.meta.update(meta)
        made.append(v)
    for i, key in inits:
        if key is not None:
            made[i].const_value = tensor(key)
    built = []
    for domain, op_type, overload, name, version, doc, ins, outs, attrs, meta in nodes:
        attributes = [a if isinstance(a, ir.Attr) else ir.Attr(a[0], a[1], a[2]) for a in attrs]
        node = ir.Node(domain, op_type, [None if i < 0 else made[i] for i in ins], attributes, overload=overload,
                       outputs=[made[i] for i in outs], version=version, name=name, doc_string=doc)
        if meta:
            node.meta.update(meta)
        built.append(node)
    gname, gdoc, opsets, gprops, gmeta = head
    graph = ir.Graph([made[i] for i in inputs], [made[i] for i in outputs], nodes=built,
                     initializers=[made[i] for i, _ in inits], doc_string=gdoc, opset_imports=opsets, name=gname,
                     metadata_props=gprops)
    if gmeta:
        graph.meta.update(gmeta)
    ir_version, producer, producer_version, domain, model_version, doc, props = model
    return Model(ir.Model(graph, ir_version=ir_version, producer_name=producer, producer_version=producer_version,
                          domain=domain, model_version=model_version, doc_string=doc, metadata_props=props),
                 check=False)


def _graph_bytes(model: Model, keys: dict[str, int]) -> bytes:
    """The serialized model with each initializer in ``keys`` a data-less stand-in naming its key, and without the
    nodes' ``metadata_props`` (as in :func:`_compact`)."""
    stand_ins = {name: f"{_STAND_IN}{key}" for name, key in keys.items()}
    return to_proto_without(model.ir, [], node_metadata=False, stand_ins=stand_ins).SerializeToString()


class VersionReceiver:
    """The child's side: the tensors by key, and the versions rebuilt from the messages."""

    def __init__(self, store: dict[int, Any]) -> None:
        self._store = dict(store)
        self._attrs: dict[tuple, Any] = {}

    def decode(self, message: tuple[tuple[str, bytes], list[tuple]], buffers: list[np.ndarray]) -> Model:
        """The version ``message`` describes; ``buffers``: the bytes of its new tensors (uint8 arrays, taken
        over: they become the tensors' read-only data)."""
        data, new = message
        it = iter(buffers)
        for key, kind, name, dtype, shape, extra in new:
            if kind == "depthwise":
                self._store[key] = DepthwiseWeight(next(it).view(dtype).reshape(shape), name=name)
            elif kind == "pickle":
                self._store[key] = ir.Tensor(freeze(pickle.loads(extra)), dtype=dtype, name=name)
            else:
                arr = freeze(next(it).view(extra).reshape(shape))
                self._store[key] = ir.Tensor(arr, dtype=dtype, name=name)
        used: dict[int, Any] = {}

        def tensor(key: int) -> Any:
            used[key] = self._store[key]
            return used[key]

        kind, data = data
        if kind == "compact":
            model = _rebuild(pickle.loads(data), tensor)
        else:
            proto = onnx.ModelProto()
            proto.ParseFromString(data)
            model = Model(proto, check=False)
            for value in model.graph.initializers.values():
                location = getattr(value.const_value, "location", None)
                if isinstance(location, str) and location.startswith(_STAND_IN):
                    value.const_value = tensor(int(location[len(_STAND_IN):]))
        self._store = used
        self._intern_attributes(model)
        return model

    def _intern_attributes(self, model: Model) -> None:
        """Give equal tensor-valued attributes the same tensor object in every version (fingerprints by identity)."""
        attrs: dict[tuple, Any] = {}
        for node in model.graph:
            for name, attr in list(node.attributes.items()):
                if attr.type != ir.AttributeType.TENSOR:
                    continue
                t = attr.value
                digest = (str(t.dtype), tuple(t.shape), hashlib.blake2b(t.tobytes(), digest_size=16).digest())
                same = attrs.get(digest) or self._attrs.get(digest)
                if same is None:
                    same = t
                elif same is not t:
                    node.attributes[name] = ir.Attr(name, ir.AttributeType.TENSOR, same)
                attrs[digest] = same
        self._attrs = attrs


# -- the process -------------------------------------------------------------------------------------------------

class _Capture(logging.Handler):
    """Collects the child's log records (as level, logger, message) to send back with the next reply."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[int, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.records.append((record.levelno, record.name, record.getMessage()))
        except Exception:  # noqa: BLE001 - a badly formatted message must not break the check
            self.records.append((record.levelno, record.name, str(record.msg)))


def replay_logs(records: list[tuple[int, str, str]]) -> None:
    """Log, in this process, the records a worker captured."""
    for level, name, message in records:
        logging.getLogger(name).log(level, "%s", message)


class _Channel:
    """One direction of a raw pipe carrying framed messages: a pickled header, then raw buffers whose sizes it
    lists. Raw reads and writes into preallocated memory, with a 1 MB pipe buffer where allowed: about 3 GB/s
    between two cores (multiprocessing's connections copy through intermediate bytes: 0.6 GB/s)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        try:
            fcntl.fcntl(write_fd, _F_SETPIPE_SZ, 1 << 20)
        except OSError:  # not allowed (pipe-max-size) or not Linux: the default size works, slower
            pass

    def write(self, header: Any, buffers: Sequence[memoryview] = ()) -> None:
        data = pickle.dumps((header, [b.nbytes for b in buffers]), protocol=pickle.HIGHEST_PROTOCOL)
        _write_all(self.write_fd, memoryview(struct.pack("<Q", len(data)) + data))
        for b in buffers:
            _write_all(self.write_fd, b.cast("B") if b.format != "B" else b)

    def read(self) -> tuple[Any, list[np.ndarray]]:
        """The next message: (header, buffers as uint8 arrays); EOFError when the writer closed the pipe."""
        (size,) = struct.unpack("<Q", _read_exact(self.read_fd, 8))
        header, sizes = pickle.loads(_read_exact(self.read_fd, size))
        return header, [_read_exact(self.read_fd, n) for n in sizes]

    def ready(self) -> bool:
        """True if a message (or the end of the pipe) can be read without waiting."""
        return bool(select.select([self.read_fd], [], [], 0)[0])


def _write_all(fd: int, view: memoryview) -> None:
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])


def _read_exact(fd: int, n: int) -> np.ndarray:
    """``n`` bytes from ``fd`` into a new uint8 array (EOFError if the pipe ends first)."""
    out = np.empty(n, np.uint8)
    view = memoryview(out)
    done = 0
    while done < n:
        got = os.readv(fd, [view[done:]])
        if got == 0:
            raise EOFError("the pipe was closed")
        done += got
    return out


class Worker:
    """A forked child serving requests in order: ``serve(request, buffers)`` runs there and its return value (which
    must pickle) comes back as the reply, with the log records the child made meanwhile; an exception it raises
    comes back as the reply ``("error", exception)``. Replies arrive in the order of the requests."""

    def __init__(self, serve: Callable[[Any, list[np.ndarray]], Any]) -> None:
        down_r, down_w = os.pipe()  # requests: parent -> child
        up_r, up_w = os.pipe()  # replies: child -> parent
        self.pending = 0
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 0
            try:
                os.close(down_w)
                os.close(up_r)
                _serve_forever(_Channel(down_r, up_w), serve)
            except BaseException:  # noqa: BLE001 - the parent sees the pipe close and reports it
                code = 1
            finally:
                os._exit(code)
        os.close(down_r)
        os.close(up_w)
        self.pid = pid
        self._channel: _Channel | None = _Channel(up_r, down_w)
        # a thread writes the requests, so that the caller goes on while their bytes move (writes release the GIL)
        self._outbox: queue.Queue = queue.Queue()
        self._write_errors: list[OSError] = []
        # (the thread holds the queue and the channel, not the worker, so that a dropped worker can be collected)
        self._writer = threading.Thread(target=_write, args=(self._outbox, self._channel, self._write_errors),
                                        name="finnlite-verify-outbox", daemon=True)
        self._writer.start()
        # a worker dropped without stop() or kill() (its owner was collected) is killed, not left running
        self._finalizer = weakref.finalize(self, _end, pid, self._outbox, self._writer, (up_r, down_w))

    def send(self, request: Any, buffers: Sequence[memoryview] = ()) -> None:
        """Queue ``request`` (and ``buffers``, which must not change until written) for the child."""
        self._require()
        if self._write_errors:
            raise RemoteError(f"the verification worker (pid {self.pid}) is gone ({self._reap()}): "
                              f"{self._write_errors[0]}")
        self._outbox.put((request, list(buffers)))
        self.pending += 1

    def replies(self, block: bool) -> list[tuple[Any, list]]:
        """The replies available now (``block``: wait for every pending one): [(reply, log records), ...]."""
        out = []
        channel = self._require()
        while self.pending and (block or channel.ready()):
            try:
                (reply, logs), _ = channel.read()
            except (EOFError, OSError):
                raise RemoteError(f"the verification worker (pid {self.pid}) died ({self._reap()})") from None
            self.pending -= 1
            out.append((reply, logs))
        return out

    def _require(self) -> _Channel:
        if self._channel is None:
            raise RemoteError("the verification worker was stopped")
        return self._channel

    def _reap(self, wait: bool = True) -> str:
        """Close the pipes and wait for the child; how it ended. Without ``wait`` (a child that read the stop request
        and said it leaves) a daemon thread waits for it: its exit, unmapping the pages it shared, takes 2 to 5 ms
        that the caller does not wait for, nor for the writer thread's end after its last write."""
        self._finalizer.detach()
        if wait and self._writer.is_alive():  # (without: the child read the stop request, the writer has ended)
            self._outbox.put((None, []))
            self._writer.join()
        if self._channel is not None:
            for fd in (self._channel.read_fd, self._channel.write_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._channel = None
        if not wait:
            threading.Thread(target=_wait_quietly, args=(self.pid,), name="finnlite-verify-reap", daemon=True).start()
            return "leaving"
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            return "already reaped"
        if os.WIFSIGNALED(status):
            return f"killed by signal {os.WTERMSIG(status)}"
        return f"exit status {os.WEXITSTATUS(status)}"

    def stop(self) -> int | None:
        """Ask the child to leave (after the requests it has) and wait for it; replies not read are dropped.
        Returns the child's peak memory above what it mapped when forked (its VmHWM less its VmRSS at the
        start, in bytes: the pages it allocated or copied on writing, at their peak), None if unknown."""
        if self._channel is None:
            return None
        self._outbox.put((None, []))  # the writer sends it after the queued requests, then ends (joined by _reap)
        growth = None
        try:
            while True:
                (reply, _), _ = self._channel.read()
                if isinstance(reply, tuple) and reply and reply[0] == "stopped":
                    growth = reply[1]
                    break
        except (EOFError, OSError):
            pass
        self._reap(wait=growth is None)  # a child that said it leaves is reaped in the background
        return growth

    def kill(self) -> None:
        """End the child now."""
        if self._channel is None:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._reap()


def _wait_quietly(pid: int) -> None:
    """Reap the child ``pid`` (gone already: nothing to do)."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _write(outbox: queue.Queue, channel: _Channel, errors: list[OSError]) -> None:
    """The parent's writer thread: the queued requests into the pipe, until a stop request (None) or an error."""
    while True:
        item = outbox.get()
        try:
            channel.write(*item)
        except OSError as exc:  # BrokenPipeError: the child is gone
            errors.append(exc)
            return
        if item[0] is None:
            return


def _end(pid: int, outbox: queue.Queue, writer: threading.Thread, fds: tuple[int, ...]) -> None:
    """Kill and reap a worker nobody stopped; end its writer thread, then close its pipes."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
    outbox.put((None, []))  # the writer's last write fails (the reader is gone) and it leaves
    writer.join()
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


_STOP = object()


def _serve_forever(channel: _Channel, serve: Callable[[Any, list[np.ndarray]], Any]) -> None:
    gc.freeze()  # the inherited objects: a collection would touch (and so copy) every page they are on
    start_rss = status_bytes("VmRSS")  # what the fork mapped: shared with the parent until written
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    capture = _Capture()
    root.addHandler(capture)
    inbox: queue.Queue = queue.Queue()

    def read() -> None:  # drains the pipe as requests come, so that the parent never waits for a check
        try:
            while True:
                request, buffers = channel.read()
                if request is None:
                    inbox.put(_STOP)
                    return
                inbox.put((request, buffers))
        except (EOFError, OSError):
            pass
        inbox.put(None)

    threading.Thread(target=read, name="finnlite-verify-inbox", daemon=True).start()
    while True:
        item = inbox.get()
        if item is None:
            return
        if item is _STOP:  # the last reply: how much memory this process added to what it shares with the parent
            peak = status_bytes("VmHWM")
            channel.write((("stopped", None if peak is None or start_rss is None else peak - start_rss), []))
            return
        request, buffers = item
        try:
            reply = serve(request, buffers)
        except BaseException as exc:  # noqa: BLE001 - carried to the parent, raised there
            reply = ("error", _portable(exc))
        logs, capture.records = capture.records, []
        channel.write((reply, logs))


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a :class:`RemoteError` with its traceback text."""
    try:
        copy = pickle.loads(pickle.dumps(exc))
        if type(copy) is type(exc):
            return exc
    except Exception:  # noqa: BLE001 - any failure to round-trip means: send the text
        pass
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    return RemoteError(f"{type(exc).__name__}: {exc} (in the verification worker)\n{text}")
