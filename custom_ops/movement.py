"""The element map of a data-movement node: which input element each output element is, found by running the node.

A data-movement op (Transpose, Reshape, DepthToSpace, nearest-neighbour Resize, Slice, Gather with constant
indices, Concat, Pad, ...) computes every output element as one element of its data inputs, or as a constant fill
(Pad's border). Running the node itself — onnxruntime, the reference of the standard ops' semantics — on index
tensors gives that map for the node's static shapes and constant parameters: data input ``i`` holds
``1 + offset_i + its flat element number`` (the inputs numbered one after the other) and a fill shows up as 0 (Pad
runs with its constant replaced by 0; the fill value is kept beside the map). So an op needs no hand-written map:
whatever onnxruntime computes is the map, modes and corner cases (Resize's coordinate modes, negative Slice steps,
DepthToSpace's DCR and CRD orders) included.

The run uses float64 tensors (indices exact below 2**53), or int32 for ops onnxruntime has no double kernel for
(Resize). The rules of :mod:`streamline` read maps through ``streamline.algebra``; the executor's float64 mode runs
a nearest-neighbour Resize (no double kernel in onnxruntime) as the gather of its map.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from finnlite.core.errors import OpError

#: the largest number of input elements a map is computed for (indices must stay exact in the run's dtype)
MAX_ELEMENTS = 1 << 24

_CACHE: "OrderedDict[bytes, ElementMap | None]" = OrderedDict()
_CACHE_SIZE = 512


@dataclass(frozen=True)
class ElementMap:
    """Output element ``e`` of output ``k`` is element ``sources[k][e]`` of the data inputs (flat, numbered one input
    after the other from ``offsets``), or the constant ``fill`` where the source is −1."""

    sources: tuple[np.ndarray, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    fill: float = 0.0

    @property
    def has_fill(self) -> bool:
        return any(bool((s < 0).any()) for s in self.sources)

    def gather(self, arrays: Sequence[np.ndarray], output: int = 0, fill: Any = 0) -> np.ndarray:
        """Output ``output`` of the op applied to ``arrays`` (one per data input, each broadcast to its input's
        shape; any dtype, object arrays of Fractions too), ``fill`` at fill positions."""
        flat = [np.broadcast_to(np.asarray(a, dtype=np.asarray(a).dtype), s).ravel()
                for a, s in zip(arrays, self.input_shapes)]
        dtype = object if any(f.dtype == object for f in flat) else np.result_type(*[f.dtype for f in flat])
        pool = np.empty(sum(f.size for f in flat) + 1, dtype=dtype)
        pool[-1] = fill
        for f, off in zip(flat, self.offsets):
            pool[off:off + f.size] = f
        src = self.sources[output]
        return pool[np.where(src < 0, pool.size - 1, src)]

    def reads(self) -> np.ndarray:
        """How many output elements (over every output) read each input element, flat in input numbering."""
        total = sum(int(np.prod(s)) for s in self.input_shapes)
        counts = np.zeros(total, dtype=np.int64)
        for src in self.sources:
            np.add.at(counts, src[src >= 0], 1)
        return counts


def _key(node: onnx.NodeProto, data: Sequence[int], shapes: Sequence[Sequence[int] | None],
         consts: Sequence[np.ndarray | None], opset: int) -> bytes:
    parts = [node.op_type.encode(), node.domain.encode(), str(opset).encode(), repr(list(data)).encode()]
    parts += [a.SerializeToString() for a in sorted(node.attribute, key=lambda a: a.name)]
    for s, c in zip(shapes, consts):
        parts.append(repr(None if s is None else tuple(s)).encode())
        if c is not None:
            parts.append(c.dtype.str.encode() + repr(c.shape).encode() + np.ascontiguousarray(c).tobytes())
    return b"\x00".join(parts)


def element_map(node: onnx.NodeProto, data: Sequence[int], shapes: Sequence[Sequence[int] | None],
                consts: Sequence[np.ndarray | None], opset: int, pad_value: int | None = None) -> ElementMap | None:
    """The element map of ``node`` (an ``onnx.NodeProto`` of a standard op): ``data`` lists its data inputs, whose
    static ``shapes`` are given; every other input must be a constant in ``consts`` (None for an absent optional
    input). ``pad_value``: the index of the input holding a fill constant (Pad's), replaced by 0 for the run. None
    when a shape or parameter is not static, the tensors are too large, or onnxruntime cannot run the node."""
    if any(shapes[i] is None or any(not isinstance(d, int) or d < 0 for d in shapes[i]) for i in data):
        return None
    for i, name in enumerate(node.input):
        if name and i not in data and consts[i] is None:
            return None
    sizes = [int(np.prod(shapes[i])) for i in data]
    if sum(sizes) >= MAX_ELEMENTS:
        return None
    key = _key(node, data, shapes, consts, opset)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    result = _compute(node, data, shapes, consts, opset, pad_value, sizes)
    _CACHE[key] = result
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return result


def _compute(node: onnx.NodeProto, data: Sequence[int], shapes: Sequence[Sequence[int] | None],
             consts: Sequence[np.ndarray | None], opset: int, pad_value: int | None,
             sizes: list[int]) -> ElementMap | None:
    from finnlite.core.compat import ort_session

    offsets = tuple(int(o) for o in np.cumsum([0] + sizes[:-1]))
    fill = 0.0
    for np_dtype, proto_dtype in ((np.float64, onnx.TensorProto.DOUBLE), (np.int32, onnx.TensorProto.INT32)):
        if np_dtype == np.int32 and sum(sizes) >= 1 << 31:
            continue
        inputs, feeds, inits = [], {}, []
        names = []
        for i, name in enumerate(node.input):
            if not name:
                names.append("")
                continue
            arg = f"in{i}"
            names.append(arg)
            if i in data:
                k = data.index(i)
                inputs.append(helper.make_tensor_value_info(arg, proto_dtype, list(shapes[i])))
                feeds[arg] = (np.arange(sizes[k], dtype=np.int64) + 1 + offsets[k]).astype(np_dtype).reshape(
                    tuple(shapes[i]))
            else:
                c = np.asarray(consts[i])
                if i == pad_value:
                    fill = float(c.ravel()[0]) if c.size else 0.0
                    c = np.zeros_like(c, dtype=np_dtype)
                inits.append(numpy_helper.from_array(c, arg))
        outs = [f"out{k}" for k in range(len(node.output))]
        run_node = helper.make_node(node.op_type, names, outs, domain=node.domain)
        run_node.attribute.extend(node.attribute)
        graph = helper.make_graph([run_node], "element_map", inputs,
                                  [helper.make_tensor_value_info(o, proto_dtype, None) for o in outs],
                                  initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        try:
            results = ort_session(model).run(None, feeds)
        except Exception:  # noqa: BLE001 - no kernel for this dtype: try the next one, or no map
            continue
        sources = tuple(np.asarray(r).astype(np.int64) - 1 for r in results)
        return ElementMap(sources, tuple(tuple(int(d) for d in shapes[i]) for i in data), offsets, fill)
    return None


def gather_by_map(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int = 19) -> list[np.ndarray]:
    """Run a single-data-input data-movement ``node`` on ``inputs`` (input 0 the data, the rest constants) as the
    gather of its element map: for dtypes onnxruntime has no kernel for (a float64 nearest-neighbour Resize). The
    node runs at ``opset`` (19 by default: every attribute of Resize up to then; the semantics of its older
    versions are the same for their attributes)."""
    x = inputs[0]
    consts = [None] + [None if a is None else np.asarray(a) for a in inputs[1:]]
    if node.op_type == "Resize":  # onnxruntime wants float32 scales and roi
        consts = [c.astype(np.float32) if c is not None and c.dtype.kind == "f" else c for c in consts]
    m = element_map(node, [0], [list(x.shape)] + [None] * (len(inputs) - 1), consts, opset)
    if m is None:
        raise OpError(f"{node.op_type}: no element map for input shape {list(x.shape)}", node=node.name)
    return [np.ascontiguousarray(m.gather([x], k)) for k in range(len(node.output))]
