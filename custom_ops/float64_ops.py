"""numpy kernels for the standard ops onnxruntime's CPU provider has no double kernel for.

The executor's float64 mode (``Executor(model, dtype=np.float64)``, used to tell float32 near-ties from bugs) runs
these nodes alone through numpy: ``Conv``, ``AveragePool`` and ``GlobalAveragePool`` — what quantized CNNs use.
They follow the ONNX operator definitions (explicit ``pads`` or ``auto_pad``, ``strides``, ``dilations``,
``group``; ``count_include_pad``); ``ceil_mode`` pooling is not supported and raises an :class:`OpError`.

Also here: :class:`Float32Parameters`, how float64 mode runs a Quant of the model's float32 constants.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import onnx

from custom_ops.base import attrs_of
from finnlite.errors import OpError


def _spatial_params(attrs: dict[str, Any], spatial: Sequence[int], kernel: Sequence[int], name: str
                    ) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """(strides, dilations, [(pad_begin, pad_end)] per spatial axis) from ONNX conv/pool attributes."""
    n = len(spatial)
    strides = list(attrs.get("strides") or [1] * n)
    dilations = list(attrs.get("dilations") or [1] * n)
    auto_pad = attrs.get("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad == "NOTSET":
        pads = list(attrs.get("pads") or [0] * (2 * n))
        return strides, dilations, [(pads[i], pads[i + n]) for i in range(n)]
    if auto_pad == "VALID":
        return strides, dilations, [(0, 0)] * n
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise OpError(f"unknown auto_pad '{auto_pad}'", node=name)
    pairs = []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        pairs.append((small, large) if auto_pad == "SAME_UPPER" else (large, small))
    return strides, dilations, pairs


def _windows(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]) -> np.ndarray:
    """(N, C, *out, *kernel) view of the sliding windows over the spatial axes of an already padded ``x``."""
    n = len(kernel)
    axes = tuple(range(2, 2 + n))
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    view = np.lib.stride_tricks.sliding_window_view(x, extent, axis=axes)
    view = view[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
                + tuple(slice(None, None, d) for d in dilations)]
    return view


def _pad(x: np.ndarray, pads: Sequence[tuple[int, int]]) -> np.ndarray:
    return np.pad(x, [(0, 0), (0, 0)] + list(pads))


def conv(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """ONNX Conv (any number of spatial axes, groups, dilations, padding)."""
    attrs = attrs_of(node)
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    group = int(attrs.get("group", 1))
    kernel = list(w.shape[2:])
    strides, dilations, pads = _spatial_params(attrs, x.shape[2:], kernel, node.name)
    win = _windows(_pad(x, pads), kernel, strides, dilations)  # N, C, *out, *k
    n_spatial = len(kernel)
    m, cg = w.shape[0], w.shape[1]
    n, out_shape = x.shape[0], win.shape[2:2 + n_spatial]
    if cg == 1 and m == group:  # depthwise: one multiply-add per kernel position
        y = np.zeros((n, m) + tuple(out_shape), dtype=np.result_type(x, w))
        for pos in np.ndindex(*kernel):
            y += win[(Ellipsis,) + pos] * w[(slice(None), 0) + pos].reshape((1, m) + (1,) * n_spatial)
    else:  # im2col and one matrix product per group
        cols = win.reshape((n, group, cg) + win.shape[2:])  # N, G, cg, *out, *k
        cols = np.moveaxis(cols, 2, 2 + n_spatial)  # N, G, *out, cg, *k
        cols = cols.reshape(n, group, int(np.prod(out_shape)), cg * int(np.prod(kernel)))
        wm = w.reshape(group, m // group, -1)  # G, mg, cg*K
        y = np.stack([np.concatenate([wm[g] @ cols[i, g].T for g in range(group)]) for i in range(n)])  # N, M, P
        y = y.reshape((n, m) + tuple(out_shape))
    if bias is not None:
        y = y + bias.reshape((1, -1) + (1,) * n_spatial)
    return [np.ascontiguousarray(y)]


def average_pool(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """ONNX AveragePool without ceil_mode."""
    attrs = attrs_of(node)
    x = inputs[0]
    if attrs.get("ceil_mode", 0):
        raise OpError("AveragePool with ceil_mode=1 is not supported in float64 mode", node=node.name)
    kernel = list(attrs["kernel_shape"])
    strides, dilations, pads = _spatial_params(attrs, x.shape[2:], kernel, node.name)
    n_spatial = len(kernel)
    k_axes = tuple(range(-n_spatial, 0))
    sums = _windows(_pad(x, pads), kernel, strides, dilations).sum(axis=k_axes)
    if attrs.get("count_include_pad", 0) or not any(p for pair in pads for p in pair):
        return [sums / float(np.prod(kernel))]
    ones = _pad(np.ones((1, 1) + x.shape[2:], dtype=x.dtype), pads)
    counts = _windows(ones, kernel, strides, dilations).sum(axis=k_axes)
    return [sums / counts]


def global_average_pool(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """ONNX GlobalAveragePool."""
    x = inputs[0]
    return [x.mean(axis=tuple(range(2, x.ndim)), keepdims=True)]


#: op_type → kernel(node, inputs) for the default domain
FLOAT64_KERNELS: dict[str, Callable[[onnx.NodeProto, Sequence[np.ndarray | None]], list[np.ndarray]]] = {
    "Conv": conv,
    "AveragePool": average_pool,
    "GlobalAveragePool": global_average_pool,
}


class Float64Op:
    """A standard node run by its numpy kernel (the executor's float64 mode); ``execute`` like a CustomOp."""

    def __init__(self, node: onnx.NodeProto) -> None:
        self.node = node
        self.name = node.name
        self.kernel = FLOAT64_KERNELS[node.op_type]

    def execute(self, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        return self.kernel(self.node, inputs)


#: quantizers whose output, when every input is a float32 constant of the model, is itself a parameter of the model
PARAMETER_QUANTIZERS = frozenset({"Quant", "IntQuant"})


class Float32Parameters:
    """A Quant of the model's float32 constants (a weight quantizer), as float64 mode runs it.

    Its output is a parameter of the model, not a data-dependent value: the integers of a quantized weight are
    what float32 arithmetic makes of the float32 weight and scale — Brevitas computes them so, qonnx and the
    convert stage fold them so, and the streamlined model holds them. Computed in float64 they can differ where
    ``fl32(w / s)`` lands on a rounding tie that the float64 quotient misses (a ProxylessNAS weight: 5.5 in
    float32, 5.49999997 in float64), which would make the float64 reference a different network. So the integers
    ``q`` come from float32 arithmetic (the inputs are float32 values widened to float64: narrowing them back is
    exact), and the weight's value ``(q − z)·s`` from float64, where it is exact (an integer of at most 24 bits
    times a float32 scale), as in the real-number semantics the rest of the float64 run follows."""

    def __init__(self, op: Any) -> None:
        self.op = op

    def execute(self, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        from custom_ops.quant import quant_integers

        self.op.validate_inputs(inputs)
        x, scale, zeropoint, bitwidth = (np.asarray(a) for a in inputs)
        f32 = [a.astype(np.float32) if a.dtype.kind == "f" else a for a in (x, scale, zeropoint)]
        q = quant_integers(*f32, bitwidth, self.op.signed, self.op.narrow, self.op.rounding_mode)
        wide = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in (q, zeropoint, scale)]
        return [np.asarray((wide[0] - wide[1]) * wide[2])]
