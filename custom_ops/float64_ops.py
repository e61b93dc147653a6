"""numpy kernels for the standard ops onnxruntime's CPU provider has no double kernel for.

The executor's float64 mode (``Executor(model, dtype=np.float64)``, used to tell float32 near-ties from bugs) runs
these nodes alone through numpy: ``Conv``, ``ConvTranspose``, ``AveragePool`` and ``GlobalAveragePool`` — what
quantized CNNs use —, a nearest-neighbour ``Resize`` (the gather of its element map, :mod:`custom_ops.movement`),
and the activations ``LeakyRelu``, ``PRelu`` and ``HardSigmoid`` (found between quantizers in Brevitas exports),
and ``QuantizeLinear``/``DequantizeLinear`` to and from integer types (QDQ models; onnxruntime wants float32 scales).
They follow the ONNX operator definitions (explicit ``pads`` or ``auto_pad``, ``strides``, ``dilations``,
``group``; ``count_include_pad``); ``ceil_mode`` pooling is not supported and raises an :class:`OpError`. A
convolution's matrix products go to onnxruntime's double MatMul (:func:`matmul`), which has one.

Also here: :class:`Float32Parameters`, how float64 mode runs a Quant of the model's float32 constants.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import onnx

from custom_ops.base import attrs_of
from finnlite.core.errors import OpError


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


_MATMUL: list[Any] = []  # the float64 MatMul session, made on first use


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` of float64 matrices, by onnxruntime (one session for every shape, its threads sleeping when idle).
    numpy's BLAS threads spin after each product, competing with everything else for the cores."""
    if not _MATMUL:
        from onnx import TensorProto, helper

        from finnlite.core.compat import ort_session

        args = [helper.make_tensor_value_info(name, TensorProto.DOUBLE, [f"{name}0", f"{name}1"]) for name in "ab"]
        graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "matmul64", args,
                                  [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
        _MATMUL.append(ort_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])))
    return _MATMUL[0].run(None, {"a": np.ascontiguousarray(a), "b": np.ascontiguousarray(b)})[0]


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
        y = np.stack([np.concatenate([matmul(wm[g], cols[i, g].T) for g in range(group)]) for i in range(n)])
        y = y.reshape((n, m) + tuple(out_shape))
    if bias is not None:
        y = y + bias.reshape((1, -1) + (1,) * n_spatial)
    return [np.ascontiguousarray(y)]


def conv_transpose(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """ONNX ConvTranspose (explicit ``pads`` and ``output_padding``, strides, dilations, groups) as the convolution
    it is: ``x`` with ``stride − 1`` zeros inserted between its elements, padded by ``d·(k − 1) − pad_begin`` before
    and ``d·(k − 1) − pad_end + output_padding`` after, convolved with the kernel flipped along every spatial axis
    and its input and output channels swapped within each group."""
    attrs = attrs_of(node)
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    n_spatial = w.ndim - 2
    if attrs.get("output_shape") or (attrs.get("auto_pad", "NOTSET") or "NOTSET") != "NOTSET":
        raise OpError("ConvTranspose with output_shape or auto_pad is not supported in float64 mode", node=node.name)
    group = int(attrs.get("group", 1))
    strides = list(attrs.get("strides") or [1] * n_spatial)
    dilations = list(attrs.get("dilations") or [1] * n_spatial)
    pads = list(attrs.get("pads") or [0] * (2 * n_spatial))
    out_pad = list(attrs.get("output_padding") or [0] * n_spatial)
    n, c = x.shape[:2]
    inserted = np.zeros((n, c) + tuple((d - 1) * s + 1 for d, s in zip(x.shape[2:], strides)), dtype=x.dtype)
    inserted[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)] = x
    cin, cout_g = w.shape[:2]
    wf = np.flip(w, axis=tuple(range(2, w.ndim)))
    wf = wf.reshape((group, cin // group, cout_g) + w.shape[2:]).swapaxes(1, 2)
    wf = wf.reshape((group * cout_g, cin // group) + w.shape[2:])
    kernel = w.shape[2:]
    conv_pads = [(d * (k - 1) - pads[i], d * (k - 1) - pads[i + n_spatial] + out_pad[i])
                 for i, (k, d) in enumerate(zip(kernel, dilations))]
    if any(p < 0 for pair in conv_pads for p in pair):
        raise OpError("ConvTranspose with pads larger than the dilated kernel is not supported in float64 mode",
                      node=node.name)
    win = _windows(_pad(inserted, conv_pads), list(kernel), [1] * n_spatial, dilations)
    m, cg = wf.shape[0], wf.shape[1]
    out_shape = win.shape[2:2 + n_spatial]
    cols = win.reshape((n, group, cg) + win.shape[2:])
    cols = np.moveaxis(cols, 2, 2 + n_spatial).reshape(n, group, int(np.prod(out_shape)), cg * int(np.prod(kernel)))
    wm = wf.reshape(group, m // group, -1)
    y = np.stack([np.concatenate([matmul(wm[g], cols[i, g].T) for g in range(group)]) for i in range(n)])
    y = y.reshape((n, m) + tuple(out_shape))
    if bias is not None:
        y = y + bias.reshape((1, -1) + (1,) * n_spatial)
    return [np.ascontiguousarray(y)]


def resize(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """ONNX Resize in ``nearest`` mode (any coordinate transformation and nearest mode): data movement, run as the
    gather of its element map (:mod:`custom_ops.movement`); the interpolating modes have no float64 kernel."""
    from custom_ops.movement import gather_by_map

    mode = attrs_of(node).get("mode", "nearest")
    if mode != "nearest":
        raise OpError(f"Resize in mode '{mode}' is not supported in float64 mode", node=node.name)
    return gather_by_map(node, inputs)


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


def leaky_relu(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """ONNX LeakyRelu: x for x ≥ 0, alpha·x otherwise (alpha defaults to 0.01)."""
    x, alpha = inputs[0], float(attrs_of(node).get("alpha", 0.01))
    return [np.where(x >= 0, x, alpha * x)]


def prelu(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """ONNX PRelu: x for x ≥ 0, slope·x otherwise (slope broadcast against x)."""
    x, slope = inputs[0], inputs[1]
    return [np.where(x >= 0, x, slope.astype(x.dtype) * x)]


def hard_sigmoid(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """ONNX HardSigmoid: max(0, min(1, alpha·x + beta)) (alpha 0.2 and beta 0.5 by default)."""
    attrs = attrs_of(node)
    x, alpha, beta = inputs[0], float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    return [np.clip(alpha * x + beta, 0.0, 1.0)]
def _per_axis(param: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A per-axis (1-D) quantization parameter shaped to broadcast along ``axis``; a scalar as it is."""
    param = np.asarray(param)
    if param.ndim == 0 or param.size == 1:
        return param.reshape(())
    return param.reshape([param.size] + [1] * (rank - 1 - axis % rank))


def _integer_bounds(dtype: np.dtype) -> tuple[int, int] | None:
    """(min, max) of an integer numpy type of at most 32 bits, ml_dtypes' int4/uint4 included; else None."""
    if dtype.name in ("int4", "uint4"):
        return (-8, 7) if dtype.name == "int4" else (0, 15)
    if dtype.kind not in "iu" or dtype.itemsize > 4:
        return None
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def quantize_linear(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """ONNX QuantizeLinear to an integer type: ``clip(round_half_even(x / s) + z, Qmin, Qmax)``, in the input's
    float type (float64 here); the output has the zero-point's integer type (uint8 without one)."""
    attrs = attrs_of(node)
    x = inputs[0]
    axis = int(attrs.get("axis", 1))
    zero = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.zeros((), np.uint8)
    bounds = _integer_bounds(zero.dtype)
    if bounds is None or attrs.get("block_size"):
        raise OpError(f"QuantizeLinear to {zero.dtype} (or block quantization) has no float64 kernel", node=node.name)
    s, z = _per_axis(inputs[1], axis, x.ndim), _per_axis(zero, axis, x.ndim).astype(np.float64)
    q = np.clip(np.round(x / s) + z, *bounds)
    return [q.astype(zero.dtype)]


def dequantize_linear(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """ONNX DequantizeLinear of an integer tensor: ``(q − z)·s`` in float64."""
    attrs = attrs_of(node)
    q = inputs[0]
    if _integer_bounds(q.dtype) is None or attrs.get("block_size"):
        raise OpError(f"DequantizeLinear of {q.dtype} (or block quantization) has no float64 kernel", node=node.name)
    axis = int(attrs.get("axis", 1))
    zero = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.zeros((), np.int64)
    s, z = _per_axis(inputs[1], axis, q.ndim), _per_axis(zero, axis, q.ndim).astype(np.float64)
    return [(q.astype(np.float64) - z) * s.astype(np.float64)]


#: op_type → kernel(node, inputs) for the default domain
FLOAT64_KERNELS: dict[str, Callable[[onnx.NodeProto, Sequence[np.ndarray | None]], list[np.ndarray]]] = {
    "Conv": conv,
    "ConvTranspose": conv_transpose,
    "Resize": resize,
    "AveragePool": average_pool,
    "GlobalAveragePool": global_average_pool,
    "LeakyRelu": leaky_relu,
    "PRelu": prelu,
    "HardSigmoid": hard_sigmoid,
    "QuantizeLinear": quantize_linear,
    "DequantizeLinear": dequantize_linear,
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
