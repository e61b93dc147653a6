"""Reading and writing model files: validation of the input, external data, atomic saves.

A model is read from a path, bytes, an ``onnx.ModelProto`` or a qonnx ``ModelWrapper``. Bad input gives a
:class:`ModelLoadError` whose one-line message names the file and the problem. External data is only read from
inside the model's folder (a ``location`` such as ``../../etc/passwd`` is refused), and must be complete.
Saving writes a temporary file beside the target and renames it, so a reader never sees half a model; the file
gets the permissions a plain write would give it (an existing file's, else 0666 less the umask).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from finnlite.core.compat import IR_VERSION, fix_ir_version
from finnlite.core.errors import ConfigError, ModelLoadError
from finnlite.core.ops import is_standard_domain
from finnlite.core.tensors import DepthwiseWeight

#: Above this many bytes a model must store its initializers as external data (protobuf's 2 GB limit).
_PROTOBUF_LIMIT = 2**31 - 2**20
#: Initializers at least this large go to the external data file when external data is requested.
_EXTERNAL_THRESHOLD = 1024


def _parse(data: bytes, where: str | None) -> onnx.ModelProto:
    if not data:
        raise ModelLoadError("the file is empty", file=where)
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"not an ONNX model (cannot parse protobuf: {exc})", file=where) from None
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise ModelLoadError("not an ONNX model (no graph with nodes or outputs)", file=where)
    if proto.ir_version <= 0:
        raise ModelLoadError("not an ONNX model (no IR version)", file=where)
    if not proto.opset_import:
        raise ModelLoadError("incomplete ONNX model: it imports no opset (a truncated file?)", file=where)
    newest = onnx.defs.onnx_opset_version()
    for opset in proto.opset_import:
        if is_standard_domain(opset.domain) and not 1 <= opset.version <= newest:
            raise ModelLoadError(f"imports ONNX opset {opset.version}; the installed onnx knows opsets 1 to "
                                 f"{newest}", file=where)
    return proto


def _external_tensors(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]


def _load_external(proto: onnx.ModelProto, base: Path, where: str) -> None:
    """Read external initializer data into ``proto``, refusing paths outside ``base`` and short files."""
    base_resolved = base.resolve()
    for tensor in _external_tensors(proto):
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if not location:
            raise ModelLoadError("external data without a location", file=where, tensor=tensor.name)
        target = (base / location).resolve()
        if os.path.isabs(location) or base_resolved not in target.parents:
            raise ModelLoadError(f"external data location '{location}' is outside the model's folder (refused)",
                                 file=where, tensor=tensor.name)
        if not target.is_file():
            raise ModelLoadError(f"external data file '{location}' is missing", file=where, tensor=tensor.name)
        offset = int(info.get("offset", 0) or 0)
        size = target.stat().st_size
        length = int(info["length"]) if "length" in info else size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise ModelLoadError(f"external data file '{location}' is truncated ({size} bytes, needs "
                                 f"{offset + length})", file=where, tensor=tensor.name)
        with open(target, "rb") as fh:
            fh.seek(offset)
            tensor.raw_data = fh.read(length)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT


def load_proto(source: Any) -> tuple[onnx.ModelProto, str | None]:
    """``(proto, path)`` for a path, bytes, ModelProto or qonnx ModelWrapper. A given ModelProto is copied, so
    the caller's object is never modified."""
    if isinstance(source, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(source)
        return proto, None
    if hasattr(source, "model") and isinstance(getattr(source, "model"), onnx.ModelProto):  # qonnx ModelWrapper
        return load_proto(source.model)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _parse(bytes(source), None), None
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        where = str(source)
        if not path.exists():
            raise ModelLoadError("no such file", file=where)
        if path.is_dir():
            raise ModelLoadError("is a directory, not a model file", file=where)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelLoadError(f"cannot read: {exc.strerror}", file=where) from None
        proto = _parse(data, where)
        if _external_tensors(proto):
            _load_external(proto, path.parent, where)
        return proto, where
    raise ModelLoadError(f"cannot load a model from a {type(source).__name__}")


def to_proto(model: ir.Model) -> onnx.ModelProto:
    """Serialize an ``onnx_ir`` model, with an IR version onnxruntime accepts and the value infos qonnx and onnx's
    shape inference accept (:func:`_clean_value_info`)."""
    proto = ir.serde.serialize_model(model)
    _clean_value_info(proto.graph)
    return fix_ir_version(proto, IR_VERSION)


def _clean_value_info(graph: onnx.GraphProto) -> None:
    """Keep one ``value_info`` per tensor, with a type, and none for a graph input or output (those carry their
    own): onnx_ir writes a bare entry for a value that has a shape but no element type, and onnx's shape
    inference (qonnx's ``InferShapes``) then finds two entries for that tensor ("Multiple ValueInfoProto")."""
    io_names = {v.name for v in graph.input} | {v.name for v in graph.output}
    seen: set[str] = set()
    keep = []
    for vi in graph.value_info:
        if vi.name in io_names or vi.name in seen or not vi.type.HasField("tensor_type"):
            continue
        seen.add(vi.name)
        keep.append(vi)
    if len(keep) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(keep)


def _to_external(proto: onnx.ModelProto, data_name: str, data_tmp: str) -> None:
    offset = 0
    with open(data_tmp, "wb") as fh:
        for tensor in proto.graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL or not tensor.HasField("raw_data"):
                continue
            raw = tensor.raw_data
            if len(raw) < _EXTERNAL_THRESHOLD:
                continue
            pad = (-offset) % 64
            fh.write(b"\0" * pad)
            offset += pad
            fh.write(raw)
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            offset += len(raw)


def _raw_everywhere(proto: onnx.ModelProto) -> None:
    """Store initializer contents as raw bytes so that they can move to an external file."""
    for i, tensor in enumerate(proto.graph.initializer):
        if tensor.data_location != onnx.TensorProto.EXTERNAL and not tensor.HasField("raw_data"):
            arr = onnx.numpy_helper.to_array(tensor)
            proto.graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(arr, tensor.name))


def check_output_path(path: str | os.PathLike, *, source: str | os.PathLike | None = None,
                      what: str = "output") -> None:
    """Raise :class:`ModelLoadError` naming ``path`` if a file cannot be written there: its folder does not exist
    or cannot be written to (a file is created and removed there, as the atomic save will), it is a directory, or
    it is the file ``source`` (the input model, however spelled or linked: it is never overwritten). Run it before
    a long computation whose result goes to ``path``; ``what`` names the file in the message."""
    path = Path(path)
    if source is not None and path.exists() and Path(source).exists() and os.path.samefile(path, source):
        raise ModelLoadError("refusing to overwrite the input model; choose another output path", file=str(path))
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ModelLoadError(f"the {what} folder does not exist", file=str(path))
    if path.is_dir():
        raise ModelLoadError(f"the {what} path is a directory", file=str(path))
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as exc:
        raise ModelLoadError(f"cannot write to the {what} folder: {exc.strerror or exc}", file=str(path)) from None
    os.close(fd)
    os.unlink(probe)


#: the name numpy gives an array saved without one (``np.savez(f, x)``)
_UNNAMED = "arr_0"


def check_input_names(path: str | os.PathLike, input_names: Sequence[str]) -> None:
    """Raise :class:`ConfigError` naming ``path`` unless its arrays fit the model's inputs ``input_names``: a
    ``.npy`` file (one array) for a single-input model, or an ``.npz`` file with one array per input, named after
    it (for a single input also the unnamed ``arr_0``). The message names the expected names. Only the names are
    read, not the arrays."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("input file not found", file=str(path))
    try:
        loaded = np.load(path, allow_pickle=False, mmap_mode="r")
    except (ValueError, OSError) as exc:
        raise ConfigError(f"cannot read the inputs: {' '.join(str(exc).split())}", file=str(path)) from None
    expected = ", ".join(f"'{n}'" for n in input_names)
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        if len(input_names) != 1:
            raise ConfigError(f"a .npy file holds one array, the model has {len(input_names)} inputs ({expected}): "
                              "give a .npz file with one array per input, named after it", file=str(path))
        return
    with loaded:
        keys = list(loaded.files)
    if len(input_names) == 1 and keys == [_UNNAMED]:
        return
    unknown = [k for k in keys if k not in input_names]
    missing = [n for n in input_names if n not in keys]
    if unknown or missing:
        quoted = lambda names: ", ".join(f"'{n}'" for n in names)  # noqa: E731
        problem = (f"array {quoted(unknown)} is not an input of the model" if len(unknown) == 1 else
                   f"arrays {quoted(unknown)} are not inputs of the model" if unknown else
                   f"no array for input {quoted(missing)} (the arrays: {quoted(keys) or 'none'})")
        raise ConfigError(f"{problem}; the model's inputs are {expected}: name each array after its input "
                          f"(np.savez(file, {input_names[0]}=...))", file=str(path))


def _plain_mode(path: Path) -> int:
    """The permission bits ``open(path, "w")`` leaves ``path`` with: an existing file's, else 0666 less the
    umask (which can only be read by setting it)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mask = os.umask(0o022)
        os.umask(mask)
        return 0o666 & ~mask


def _temp_beside(path: Path, folder: Path) -> tuple[int, str]:
    """A new temporary file in ``folder`` for an atomic write of ``path``, with ``path``'s plain permissions (not
    ``mkstemp``'s owner-only 0600): ``(descriptor, name)``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, _plain_mode(path))
    except OSError:  # a file system without Unix permissions: mkstemp's stay
        pass
    return fd, tmp


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then rename it to ``path``: a reader sees the old file
    or the whole new one. An :class:`OSError` becomes a :class:`ModelLoadError` naming ``path``."""
    path = Path(path)
    folder = _check_target(path)
    fd, tmp = _temp_beside(path, folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except OSError as exc:
        raise ModelLoadError(f"cannot save: {exc.strerror or exc}", file=str(path)) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_model(model: ir.Model, path: str | os.PathLike, *, external_data: bool | None = None) -> None:
    """Write an ``onnx_ir`` model to ``path`` atomically; see :meth:`finnlite.Model.save`. Without external data
    the file is streamed: the model without its initializers, then one initializer at a time, in the bytes
    ``to_proto(model).SerializeToString()`` gives — where serializing the whole model held every weight three
    times (the model's arrays, the ModelProto and its serialization).
    External data (asked for, or a model over protobuf's 2 GB limit) goes through :func:`save_proto`."""
    path = Path(path)
    _check_target(path)  # before the work of serializing
    if external_data:
        save_proto(to_proto(model), path, external_data=True)
        return
    head, tail, tensors = _skeleton(model)
    parts = [_array_parts(t) for t in tensors]
    sizes = [_parts_size(p) if p is not None else len(ir.serde.serialize_tensor(t).SerializeToString())
             for t, p in zip(tensors, parts)]
    graph_size = len(head[1]) + len(tail[0]) + sum(_field_size(n) for n in sizes)
    model_size = len(head[0]) + _field_size(graph_size) + len(tail[1])
    if model_size > _PROTOBUF_LIMIT:
        save_proto(to_proto(model), path, external_data=True)
        return

    def stream(fh: BinaryIO) -> None:
        fh.write(head[0] + _key(7) + _varint(graph_size) + head[1])
        for tensor, part, size in zip(tensors, parts, sizes):
            fh.write(_key(5) + _varint(size))
            if part is not None:  # the array's bytes go straight to the file
                fh.write(part[0] + _key(9) + _varint(part[1]))
                fh.flush()
                tensor.tofile(fh)
                fh.write(part[2])
                continue
            fh.write(ir.serde.serialize_tensor(tensor).SerializeToString())  # its size was counted the same way
        fh.write(tail[0] + tail[1])

    write_atomic(path, stream)


def _check_target(path: Path) -> Path:
    """The folder of ``path``; a :class:`ModelLoadError` if it does not exist or ``path`` is a directory."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ModelLoadError("cannot save: the output folder does not exist", file=str(path))
    if path.is_dir():
        raise ModelLoadError("cannot save: the output path is a directory", file=str(path))
    return folder


def to_proto_without(model: ir.Model, names: Iterable[str], *, node_metadata: bool = True,
                     stand_ins: Mapping[str, str] | None = None) -> onnx.ModelProto:
    """``to_proto(model)`` without the main graph's initializers ``names``: they are serialized as data-less
    stand-ins and dropped, so their data is neither copied nor serialized (the model is left as it was). With
    ``node_metadata=False`` the main graph's nodes are serialized without their ``metadata_props`` (for an
    executor, which never reads them: exact thresholds are kept there).
    ``stand_ins``: {initializer name: location} for initializers kept in the proto as data-less external tensors
    naming that location (for a reader that holds their data under those names)."""
    stand_ins = stand_ins or {}
    values = [v for name in dict.fromkeys([*names, *stand_ins]) if (v := model.graph.initializers.get(name)) is not None
              and v.const_value is not None]
    tensors = [v.const_value for v in values]
    held = [] if node_metadata else [(n, dict(n.metadata_props)) for n in model.graph if n.metadata_props]
    try:
        for v, t in zip(values, tensors):
            location = stand_ins.get(v.name, "finnlite-stand-in")
            v.const_value = ir.ExternalTensor(location, 0, 0, t.dtype, shape=t.shape, name=v.name)
        for n, _ in held:
            n.metadata_props.clear()
        proto = to_proto(model)
    finally:
        for v, t in zip(values, tensors):
            v.const_value = t
        for n, props in held:
            n.metadata_props.update(props)
    dropped = {v.name for v in values if v.name not in stand_ins}
    kept = [t for t in proto.graph.initializer if t.name not in dropped]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(kept)
    return proto


def _skeleton(model: ir.Model) -> tuple[tuple[bytes, bytes], tuple[bytes, bytes], list[Any]]:
    """The serialized model without the main graph's initializers, cut where they go: ``(model fields before the
    graph, graph fields before the initializers)``, ``(graph fields after them, model fields after the graph)``,
    and the initializers' tensors in order (named as serialization names them). Fields are in field-number
    order, as protobuf serializes them."""
    values = [v for v in model.graph.initializers.values() if v.const_value is not None]
    tensors = [v.const_value for v in values]
    proto = to_proto_without(model, [v.name for v in values])
    for v, t in zip(values, tensors):
        t.name = v.name  # as serialization does
    del proto.graph.initializer[:]
    data = proto.SerializeToString()
    graph = [f for f in _fields(data) if f[0] == 7]
    if len(graph) != 1:
        raise ValueError("expected one graph field")
    _, start, body, end = graph[0]
    gdata = data[body:end]
    gfields = _fields(gdata)
    before = b"".join(gdata[s:e] for n, s, _, e in gfields if n < 5)
    after = b"".join(gdata[s:e] for n, s, _, e in gfields if n > 5)
    return (data[:start], before), (after, data[end:]), tensors


def _array_parts(tensor: Any) -> tuple[bytes, int, bytes] | None:
    """For a numpy-backed tensor or a :class:`~finnlite.core.tensors.DepthwiseWeight` (whose ``tofile`` writes the dense
    matrix block by block), its serialized TensorProto as ``(fields before raw_data, data bytes, fields after)``,
    made without copying the data; None for other tensors (serialized whole)."""
    if isinstance(tensor, DepthwiseWeight):
        dtype = tensor.kernel.dtype
    elif (isinstance(tensor, ir.Tensor) and isinstance(tensor.raw, np.ndarray) and tensor.dtype.itemsize >= 1
          and tensor.raw.nbytes == tensor.nbytes):
        dtype = tensor.raw.dtype
    else:
        return None
    probe = ir.Tensor(np.zeros(0, dtype), dtype=tensor.dtype, name=tensor.name,
                      doc_string=tensor.doc_string, metadata_props=dict(tensor.metadata_props))
    stub = ir.serde.serialize_tensor(probe)
    stub.ClearField("dims")
    stub.dims.extend(tensor.shape.numpy())
    data = stub.SerializeToString()
    fields = _fields(data)
    if [n for n, *_ in fields].count(9) != 1:
        return None
    before = b"".join(data[s:e] for n, s, _, e in fields if n < 9)
    after = b"".join(data[s:e] for n, s, _, e in fields if n > 9)
    return before, tensor.nbytes, after


def _parts_size(parts: tuple[bytes, int, bytes]) -> int:
    before, n, after = parts
    return len(before) + 1 + len(_varint(n)) + n + len(after)


def _key(field: int) -> bytes:
    return _varint(field << 3 | 2)  # a length-delimited field


def _field_size(n: int) -> int:
    """Bytes of a length-delimited field numbered below 16 (one key byte) holding ``n`` bytes."""
    return 1 + len(_varint(n)) + n


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _fields(data: bytes) -> list[tuple[int, int, int, int]]:
    """``(field number, start, payload start, end)`` of the top-level fields of a serialized message."""
    out = []
    i = 0
    while i < len(data):
        start = i
        key, i = _read_varint(data, i)
        wire = key & 7
        body = i
        if wire == 0:
            _, i = _read_varint(data, i)
        elif wire == 1:
            i += 8
        elif wire == 2:
            length, body = _read_varint(data, i)
            i = body + length
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unexpected wire type {wire}")
        out.append((key >> 3, start, body, i))
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i
        shift += 7


def save_proto(proto: onnx.ModelProto, path: str | os.PathLike, *, external_data: bool | None = None) -> None:
    """Write ``proto`` to ``path`` atomically; see :meth:`finnlite.Model.save`."""
    path = Path(path)
    folder = _check_target(path)
    data: bytes | None = None
    if external_data is None:
        # serializing once answers the size question too (ByteSize() costs as much as serializing)
        try:
            data = proto.SerializeToString()
        except Exception:  # noqa: BLE001 - protobuf refuses messages over 2 GB (ValueError / EncodeError)
            data = None
        external_data = data is None or len(data) > _PROTOBUF_LIMIT
    data_tmp = None
    fd, model_tmp = _temp_beside(path, folder)
    os.close(fd)
    try:
        data_name = path.name + ".data"
        if external_data:
            _raw_everywhere(proto)
            fd, data_tmp = _temp_beside(folder / data_name, folder)
            os.close(fd)
            _to_external(proto, data_name, data_tmp)
            data = None
        with open(model_tmp, "wb") as fh:
            fh.write(data if data is not None else proto.SerializeToString())
        if data_tmp is not None:
            os.replace(data_tmp, folder / data_name)
            data_tmp = None
        os.replace(model_tmp, path)
    except OSError as exc:
        raise ModelLoadError(f"cannot save: {exc.strerror}", file=str(path)) from None
    finally:
        for tmp in (model_tmp, data_tmp):
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
