"""Integer fast path of the executor: ``Im2Col → MatMul`` run as one onnxruntime ``Conv`` when that is exact.

A streamlined FINN-ONNX model computes a convolution as ``Im2Col`` (a numpy kernel that materializes every window,
``kh·kw`` times the activation) followed by a ``MatMul`` with the weight matrix; a depthwise convolution gets a
block-diagonal ``(kh·kw·C, C)`` matrix, ``C`` times the work of the convolution itself. Both are what the model
says, and the executor must compute what they compute — but when the operands are small integers the result of the
``MatMul`` does not depend on how it is computed:

**Exactness argument.** Let every element of the ``Im2Col`` input be an integer with ``|x| ≤ X`` (and the pad value
too), and the weight matrix ``W`` integer-valued with column sums ``Σ_k |W[k, j]| ≤ S_j``. If ``X · max_j S_j <
2**24``, every product and every partial sum of every output, in *any* order of summation, is an integer below
``2**24`` in magnitude and so exactly representable in float32: the float32 ``MatMul`` result is the exact integer
dot product, whatever kernel computes it (FMA or not, any blocking). A ``Conv`` with the reshaped weights computes
the same dot products (the same terms, the zeros of the block-diagonal matrix left out), so its result is
bit-identical — up to the sign of an all-zero sum, which a final ``Add(+0)`` makes ``+0`` as the MatMul's own
zero-initialised accumulators do.

The integer bounds come from a forward pass over the graph (:func:`integer_ranges`): ``MultiThreshold`` outputs are
``out_scale·n + out_bias`` with ``0 ≤ n ≤ steps`` (integers when ``out_scale`` and ``out_bias`` are), layout and
pooling ops keep their input's range, ``Im2Col`` adds its pad value, and a ``MatMul``/``Add``/``Mul`` with integer
operands has an integer result while its bound stays below ``2**24``. Anything else (a float graph input, a Quant
with a fractional scale) has no range, and its ``Im2Col`` runs as before. The fast path is used only in float32
plans; where the Im2Col output is needed too (``return_all``, another reader, a graph output) the Im2Col still
runs for it and only the MatMul runs as the Conv.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from custom_ops.lowering import Lowering, LoweringContext, Emitter
from finnlite.core.blockwise import all_integral
from finnlite.core.tensors import DepthwiseWeight, is_frozen

#: integers of magnitude below this are exact in float32, and so is every sum of them that stays below it
EXACT_LIMIT = float(2 ** 24)

Range = tuple[float, float]
_SAME_RANGE = {"Identity", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "MaxPool", "MaxPoolNHWC",
               "GlobalMaxPool", "Relu"}


class _FrozenMemo:
    """Facts computed from a constant that cannot change (:func:`finnlite.core.model.is_frozen`: every initializer the
    model sets), kept while its memory lives. The verifier builds an executor for every check and the final check
    one more, each over the same lowered weights: the integer test (a few passes over each weight) then runs once
    per weight instead of once per executor. Other arrays are not remembered."""

    def __init__(self) -> None:
        self._entries: dict[tuple, Any] = {}
        self._watched: set[int] = set()

    def get(self, value: np.ndarray, what: tuple, compute: Callable[[], Any]) -> Any:
        if not is_frozen(value):
            return compute()
        root = value
        while isinstance(root.base, np.ndarray):
            root = root.base
        key = (id(root), value.__array_interface__["data"][0], value.shape, value.strides, value.dtype.str) + what
        hit = self._entries.get(key)
        if hit is None:
            hit = self._entries[key] = compute()
            if id(root) not in self._watched:  # forget its entries when the memory goes (before its id is reused)
                self._watched.add(id(root))
                weakref.finalize(root, self._forget, id(root))
        return hit

    def _forget(self, root: int) -> None:
        self._watched.discard(root)
        for key in [k for k in self._entries if k[0] == root]:
            del self._entries[key]


_MEMO = _FrozenMemo()


def _integer_const(value: np.ndarray) -> Range | None:
    return _MEMO.get(value, ("integer",), lambda: _integer_range(value))


def _integer_range(value: np.ndarray) -> Range | None:
    """The (min, max) of a float constant whose elements are all integers below EXACT_LIMIT in magnitude, else
    None; the integer test runs block by block (finnlite.core.blockwise: no temporary as large as the weight)."""
    if value.dtype.kind != "f" or value.size == 0:
        return None
    lo, hi = float(value.min()), float(value.max())
    if not (np.isfinite(lo) and np.isfinite(hi)) or max(-lo, hi) >= EXACT_LIMIT or not all_integral(value):
        return None
    return (lo, hi)


def _bound(r: Range) -> float:
    return max(-r[0], r[1])


class _Weights:
    """Per-constant facts, computed once: integer range, and the largest column sum of magnitudes. ``sparse``:
    depthwise weight matrices held as their kernels (:class:`~finnlite.core.tensors.DepthwiseWeight`), whose facts come
    from the kernel (the dense matrix holds the kernel's values and zeros; column ``c`` holds ``kernel[c]``)."""

    def __init__(self, constants: Mapping[str, np.ndarray],
                 sparse: Mapping[str, DepthwiseWeight] | None = None) -> None:
        self.constants = constants
        self.sparse = sparse or {}
        self._range: dict[str, Range | None] = {}
        self._colsum: dict[str, float] = {}

    def shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.sparse:
            return tuple(int(d) for d in self.sparse[name].shape)
        return tuple(self.constants[name].shape) if name in self.constants else None

    def range(self, name: str) -> Range | None:
        if name not in self._range:
            if name in self.sparse:
                t = self.sparse[name]
                self._range[name] = _MEMO.get(t.kernel, ("integer", "dw", t.channels > 1),
                                              lambda: _integer_range(t.element_values()))
            else:
                self._range[name] = _integer_const(self.constants[name]) if name in self.constants else None
        return self._range[name]

    def _column_sum(self, name: str) -> float:
        if name not in self._colsum:
            if name in self.sparse:
                k = self.sparse[name].column_weights()
                self._colsum[name] = float(np.abs(k).sum(axis=1, dtype=np.float64).max(initial=0.0))
            else:
                w = self.constants[name]
                self._colsum[name] = _MEMO.get(w, ("colsum",), lambda: float(
                    np.abs(w).sum(axis=0, dtype=np.float64).max(initial=0.0)))
        return self._colsum[name]

    def matmul_range(self, x: Range, name: str) -> Range | None:
        """The range of ``x @ W`` for integer ``x`` in ``x`` and the constant ``W`` named ``name``, if exact."""
        shape = self.shape(name)
        wr = self.range(name) if shape is not None and len(shape) == 2 else None
        if wr is None or shape is None:
            return None
        b = _bound(x) * shape[0] * _bound(wr)  # K·max|W| bounds every column sum: no pass over W if it suffices
        if b >= EXACT_LIMIT:
            b = _bound(x) * self._column_sum(name)
        return (-b, b) if b < EXACT_LIMIT else None


def integer_ranges(nodes: Sequence[onnx.NodeProto], ops: Mapping[int, Any], constants: Mapping[str, np.ndarray],
                   weights: _Weights | None = None) -> dict[str, Range]:
    """Tensors whose every element is, on any input, an integer in the range ``(lo, hi)`` (module docstring)."""
    weights = weights or _Weights(constants)
    ranges: dict[str, Range] = {}

    def const_range(name: str) -> Range | None:
        return ranges.get(name) if name in ranges else weights.range(name)

    for i, node in enumerate(nodes):
        if not node.output or not node.input or not node.input[0]:
            continue
        x = const_range(node.input[0])
        op, out = node.op_type, None
        if op == "MultiThreshold" and i in ops and len(node.input) == 2 and node.input[1] in constants:
            scale, bias = ops[i].out_scale, ops[i].out_bias
            steps = constants[node.input[1]].shape[-1]
            ends = (bias, bias + scale * steps)
            if float(scale).is_integer() and float(bias).is_integer() and max(map(abs, ends)) < EXACT_LIMIT:
                out = (min(ends), max(ends))
        elif x is None:
            continue
        elif op in _SAME_RANGE:
            out = x
        elif op == "Im2Col" and i in ops:
            pad = float(ops[i].pad_value)
            out = (min(x[0], pad), max(x[1], pad)) if any(ops[i].pad_amount) else x
            out = out if _bound(out) < EXACT_LIMIT else None
        elif op == "MatMul" and len(node.input) == 2 and weights.shape(node.input[1]) is not None:
            out = weights.matmul_range(x, node.input[1])
        elif op in ("Add", "Sub", "Mul") and len(node.input) == 2:
            y = const_range(node.input[1])
            if y is not None:
                if op == "Add":
                    out = (x[0] + y[0], x[1] + y[1])
                elif op == "Sub":
                    out = (x[0] - y[1], x[1] - y[0])
                else:
                    corners = [a * b for a in x for b in y]
                    out = (min(corners), max(corners))
                out = out if _bound(out) < EXACT_LIMIT else None
        if out is not None:
            ranges[node.output[0]] = out
    return ranges


def conv_weights(w: np.ndarray | DepthwiseWeight, kernel: Sequence[int], channels: int) -> tuple[np.ndarray, int]:
    """The ``Conv`` weights ``(Cout, Cin/group, kh, kw)`` and group count for an Im2Col weight matrix
    ``(kh·kw·Cin, Cout)`` whose rows are in (kh, kw, Cin) order: depthwise (group = C) when the matrix is
    block-diagonal with Cin = Cout (a :class:`~finnlite.core.tensors.DepthwiseWeight`: its kernel, no copy), dense
    otherwise."""
    kh, kw = kernel
    if isinstance(w, DepthwiseWeight):  # row (a·kw + b)·C + c of column c is kernel position a·kw + b
        return w.kernel.reshape(w.channels, 1, kh, kw), w.channels
    cout = w.shape[1]
    w4 = w.reshape(kh, kw, channels, cout)
    if channels == cout and channels > 1:
        diag = np.arange(channels)
        # the off-diagonal elements of each (C, C) block, as a view: in a block flattened without its first
        # element, rows of C + 1 end on the diagonal
        blocks = w4.reshape(kh * kw, channels * channels)[:, 1:].reshape(kh * kw, channels - 1, channels + 1)
        if not blocks[:, :, :channels].any():
            dw = w4[:, :, diag, diag]  # (kh, kw, C)
            return np.ascontiguousarray(dw.transpose(2, 0, 1)[:, None]), channels
    # one kernel position at a time: each (Cin, Cout) slice transposed whole, rather than a copy of the 4-d
    # transposed view
    out = np.empty((cout, channels, kh * kw), w4.dtype)
    for k, block in enumerate(w4.reshape(kh * kw, channels, cout)):
        out[:, :, k] = block.T
    return out.reshape(cout, channels, kh, kw), 1


def fuse_im2col_matmul(nodes: Sequence[onnx.NodeProto], ops: Mapping[int, Any], constants: Mapping[str, np.ndarray],
                       ctx: LoweringContext, outputs: Sequence[str],
                       sparse: Mapping[str, DepthwiseWeight] | None = None) -> dict[int, tuple[int, Lowering, bool]]:
    """For each ``Im2Col`` (index i) that feeds a ``MatMul`` (index j) with constant weights (arrays in
    ``constants``, or depthwise matrices held compact in ``sparse``), and whose operands have integer bounds that
    make the product exact: ``{i: (j, lowering, private)}``, the lowering computing the MatMul's output from the
    Im2Col's input through one ``Conv``; ``private`` when that MatMul is the only reader of the Im2Col's output and
    it is not a graph output (then the Im2Col need not run at all)."""
    if ctx.dtype != np.float32 or ctx.opset < 11 or not any(n.op_type == "Im2Col" for n in nodes):
        return {}
    sparse = sparse or {}
    weights = _Weights(constants, sparse)
    ranges = integer_ranges(nodes, ops, constants, weights)
    consumers: dict[str, list[int]] = {}
    for j, node in enumerate(nodes):
        for t in node.input:
            consumers.setdefault(t, []).append(j)
    fused: dict[int, tuple[int, Lowering, bool]] = {}
    for i, node in enumerate(nodes):
        if node.op_type != "Im2Col" or i not in ops:
            continue
        users = consumers.get(node.output[0], [])
        private = len(users) == 1 and node.output[0] not in outputs
        rng, shape, op = ranges.get(node.output[0]), ctx.shapes.get(node.input[0]), ops[i]
        if rng is None or shape is None or len(shape) != 4 or shape[3] is None:
            continue
        for j in users:
            mm = nodes[j]
            if (mm.op_type != "MatMul" or len(mm.input) != 2 or mm.input[0] != node.output[0]
                    or mm.input[1] == node.output[0] or weights.shape(mm.input[1]) is None):
                continue
            w: Any = sparse[mm.input[1]] if mm.input[1] in sparse else constants[mm.input[1]]
            dtype = w.kernel.dtype if isinstance(w, DepthwiseWeight) else w.dtype
            w_shape = weights.shape(mm.input[1])
            if (dtype != np.float32 or len(w_shape) != 2
                    or w_shape[0] != op.kernel_size[0] * op.kernel_size[1] * shape[3]
                    or (isinstance(w, DepthwiseWeight) and w.channels != shape[3])
                    or weights.matmul_range(rng, mm.input[1]) is None):
                continue
            fused[i] = (j, _lower(node, mm, op, w, int(shape[3]), ctx), private)
            break
    return fused


def _lower(im2col: onnx.NodeProto, matmul: onnx.NodeProto, op: Any, w: np.ndarray | DepthwiseWeight, channels: int,
           ctx: LoweringContext) -> Lowering:
    """Transpose(NHWC→NCHW) → [Pad with the pad value] → Conv → Transpose(NCHW→NHWC) → Add(+0)."""
    em = Emitter(im2col, ctx)
    weights, group = conv_weights(w, op.kernel_size, channels)  # not remembered: a copy as large as the weight
    x = em.op("Transpose", [im2col.input[0]], perm=[0, 3, 1, 2])
    top, left, bottom, right = op.pad_amount
    pads = [top, left, bottom, right]
    if any(pads) and op.pad_value != 0:
        pad_spec = em.const([0, 0, top, left, 0, 0, bottom, right], "pads", np.int64)
        x = em.op("Pad", [x, pad_spec, em.const(float(op.pad_value), "pad_value")], mode="constant")
        pads = [0, 0, 0, 0]
    y = em.op("Conv", [x, em.const(weights, "conv_weights")], kernel_shape=list(op.kernel_size),
              strides=list(op.stride), dilations=list(op.dilations), pads=pads, group=group)
    y = em.op("Transpose", [y], perm=[0, 2, 3, 1])
    em.op("Add", [y, em.const(0.0, "plus_zero")], output=matmul.output[0])
    return em.result

