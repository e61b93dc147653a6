"""Inference cost of a QONNX / FINN-ONNX model, reported the way qonnx's ``inference_cost`` tool reports it.

For every multiply-accumulate layer (Conv, MatMul, Gemm, XnorPopcountMatMul) the cost is:

* **MACs** by (input datatype, weight datatype) pair, keyed ``op_mac_<IDT>_<WDT>``; for Conv
  ``batch · (out channels / group) · in channels · kernel size · output pixels``, for a matrix product
  ``K · elements of the output`` (K the reduced dimension);
* **bit-operations** (bops): MACs times the two bitwidths;
* **weight memory** (``mem_w_<WDT>``): the elements of the constant operand, in bits via its datatype;
* **activation memory** (``mem_o_<ODT>``): the elements of the layer's output, in bits via its datatype.

With ``discount_sparsity`` (the default, as in qonnx) MACs and weight memory are scaled by the fraction of non-zero
weights after quantization (not for XnorPopcountMatMul, whose 0 weights encode -1). Datatypes are read from the
annotations where present; on an unstreamlined QONNX graph they are derived as qonnx's
``InferDataTypes(allow_scaledint_dtypes=True)`` derives them: a weight or activation behind a ``Quant`` is
``INTn``/``UINTn`` (unit scale, zero zero-point), otherwise ``SCALEDINT<n>``; ``BipolarQuant`` gives ``BIPOLAR``;
data-movement ops pass their input's datatype on; an accumulator of integer operands is
``INT32`` (``SCALEDINT<32>`` if an operand is scaled); anything else is ``FLOAT32``. Ops without arithmetic cost
(quantizers, thresholds, pooling, element-wise scaling, data movement) count nothing; other ops are listed as
``unsupported``. :func:`datatype_histogram` counts a model's datatype annotations.

Each layer also carries the widths FINN builds it with (``finnlite info``'s layer table,
:meth:`InferenceCost.layer_table`): its weight and input datatypes, the accumulator FINN's MinimizeAccumulatorWidth
sizes from the weights' values and the input datatype (:mod:`finnlite.core.ranges`), and the output (the fused
MultiThreshold's, else the accumulator).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx_ir as ir

from custom_ops.bipolar_quant import bipolar_quant
from custom_ops.common import by_rows, MAX_BITWIDTH
from custom_ops.quant import quant_rows
from finnlite.core.datatypes import BaseDataType, DataType, int_type, is_integer_type, tightest_datatype
from finnlite.core.graphutil import zero_padded
from finnlite.core.model import Model, as_model
from finnlite.core.ranges import accumulator_range, weight_sums
from finnlite.core.shapes import const_array
from finnlite.core.tensors import DepthwiseWeight

__all__ = ["InferenceCost", "LayerCost", "inference_cost", "datatype_histogram", "format_count", "derived_datatypes",
           "bits"]

#: ops with no arithmetic cost in the estimate (qonnx's list, plus the FINN-ONNX ops of a streamlined graph)
ZERO_COST_OPS = frozenset({
    "MaxPool", "AveragePool", "GlobalAveragePool", "Quant", "BipolarQuant", "Trunc", "QuantizeLinear",
    "DequantizeLinear", "Reshape", "Concat", "Transpose", "Div", "Mul", "Add", "Sub", "BatchNormalization", "Relu",
    "Elu", "Selu", "Sigmoid", "Identity", "Flatten", "Pad", "Clip", "Squeeze", "Unsqueeze", "Slice", "Gather",
    "Split", "Expand", "Constant", "MultiThreshold", "Im2Col", "MaxPoolNHWC", "QuantAvgPool2d", "TopK", "ArgMax",
    "Round", "Floor", "Sign", "Softmax", "LogSoftmax", "Shape",
})
#: ops whose output carries their (first) input's datatype
_PASS_THROUGH = frozenset({"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Slice", "Gather",
                           "MaxPool", "MaxPoolNHWC", "Im2Col", "Concat", "Split", "Expand"})
_MAC_OPS = frozenset({"Conv", "MatMul", "Gemm", "XnorPopcountMatMul"})
_FLOAT32 = DataType["FLOAT32"]


@dataclass
class LayerCost:
    """The cost of one multiply-accumulate node."""

    node: str
    op_type: str
    input_dt: str
    weight_dt: str
    output_dt: str
    macs: float
    weight_elems: float
    output_elems: float
    #: the accumulator's datatype, as FINN's MinimizeAccumulatorWidth sizes it: the range of the products of the
    #: weights' values with inputs anywhere in the input datatype's range (:mod:`finnlite.core.ranges`; for an
    #: XnorPopcountMatMul, as FINN's binaryXnorMode: the bipolar weights 2W - 1 on the input's {0, 1}); "-" unless
    #: the weights are integers and the input datatype is integer
    acc_dt: str = "-"
    #: the datatype of what FINN's layer outputs: that of the MultiThreshold it absorbs (the layer's only consumer),
    #: else the accumulator (FINN's noActivation layers output it; FINN rounds it up to a multiple of 8 bits for a
    #: layer with no successor)
    finn_output_dt: str = "-"

    @property
    def bops(self) -> float:
        return self.macs * _bits(self.input_dt) * _bits(self.weight_dt)


@dataclass
class InferenceCost:
    """The inference cost of a model: per layer, and totals by datatype (see the module docstring)."""

    layers: list[LayerCost] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    discount_sparsity: bool = True

    def macs_by_type(self) -> dict[tuple[str, str], float]:
        """MACs by (input datatype, weight datatype)."""
        out: dict[tuple[str, str], float] = {}
        for layer in self.layers:
            key = (layer.input_dt, layer.weight_dt)
            out[key] = out.get(key, 0.0) + layer.macs
        return out

    def bops_by_type(self) -> dict[tuple[str, str], float]:
        """Bit-operations by (input datatype, weight datatype)."""
        return {k: v * _bits(k[0]) * _bits(k[1]) for k, v in self.macs_by_type().items()}

    def weight_elems_by_type(self) -> dict[str, float]:
        """Weight elements by datatype."""
        return _sum_by(self.layers, lambda c: c.weight_dt, lambda c: c.weight_elems)

    def output_elems_by_type(self) -> dict[str, float]:
        """Activation (layer output) elements by datatype."""
        return _sum_by(self.layers, lambda c: c.output_dt, lambda c: c.output_elems)

    @property
    def total_macs(self) -> float:
        return sum(c.macs for c in self.layers)

    @property
    def total_bops(self) -> float:
        return sum(self.bops_by_type().values())

    @property
    def total_mem_w_bits(self) -> float:
        return sum(n * _bits(dt) for dt, n in self.weight_elems_by_type().items())

    @property
    def total_mem_o_bits(self) -> float:
        return sum(n * _bits(dt) for dt, n in self.output_elems_by_type().items())

    def to_dict(self) -> dict[str, Any]:
        """The totals under qonnx's keys (``op_mac_<IDT>_<WDT>``, ``mem_w_<DT>``, ``mem_o_<DT>``, ``total_macs``,
        ``total_bops``, ``total_mem_w_bits``, ``total_mem_w_elems``, ``total_mem_o_bits``, ``total_mem_o_elems``,
        ``unsupported``, ``discount_sparsity``)."""
        out: dict[str, Any] = {}
        for (idt, wdt), n in self.macs_by_type().items():
            out[f"op_mac_{idt}_{wdt}"] = n
        for dt, n in self.weight_elems_by_type().items():
            out[f"mem_w_{dt}"] = n
        for dt, n in self.output_elems_by_type().items():
            out[f"mem_o_{dt}"] = n
        out.update(total_macs=self.total_macs, total_bops=self.total_bops, total_mem_w_bits=self.total_mem_w_bits,
                   total_mem_w_elems=sum(self.weight_elems_by_type().values()),
                   total_mem_o_bits=self.total_mem_o_bits,
                   total_mem_o_elems=sum(self.output_elems_by_type().values()),
                   unsupported=list(self.unsupported), discount_sparsity=self.discount_sparsity)
        return out

    def text(self) -> str:
        """A few lines for people."""
        lines = [f"MACs {format_count(self.total_macs)}, bit-operations {format_count(self.total_bops)}, "
                 f"weights {format_count(self.total_mem_w_bits)}bit, activations "
                 f"{format_count(self.total_mem_o_bits)}bit ({len(self.layers)} MAC layers"
                 + (", sparsity discounted)" if self.discount_sparsity else ")")]
        for (idt, wdt), n in sorted(self.macs_by_type().items(), key=lambda kv: -kv[1]):
            lines.append(f"  {idt} x {wdt}: {format_count(n)} MACs, "
                         f"{format_count(n * _bits(idt) * _bits(wdt))} bops")
        weights = ", ".join(f"{dt} {format_count(n * _bits(dt))}bit" for dt, n in self.weight_elems_by_type().items())
        acts = ", ".join(f"{dt} {format_count(n * _bits(dt))}bit" for dt, n in self.output_elems_by_type().items())
        if weights:
            lines.append(f"  weights: {weights}")
        if acts:
            lines.append(f"  activations: {acts}")
        if self.unsupported:
            lines.append(f"  not counted (unsupported ops): {', '.join(self.unsupported)}")
        return "\n".join(lines)

    def layer_table(self) -> list[str]:
        """Per MAC layer, the widths FINN builds it with: weight, input, accumulator and output datatypes (see
        :class:`LayerCost`), one line each under a header."""
        rows = [("layer", "op", "weight", "input", "accumulator", "output")]
        rows += [(c.node, c.op_type, c.weight_dt, c.input_dt, c.acc_dt, c.finn_output_dt) for c in self.layers]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]


def format_count(n: float) -> str:
    """``1234567`` -> ``'1.23 M'``; small counts stay whole numbers."""
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.0f} " if float(n).is_integer() else f"{n:.3g} "


def _bits(dt: str) -> int:
    return DataType[dt].bitwidth()


def _sum_by(layers: list[LayerCost], key: Callable[[LayerCost], str], value: Callable[[LayerCost], float]
            ) -> dict[str, float]:
    out: dict[str, float] = {}
    for layer in layers:
        out[key(layer)] = out.get(key(layer), 0.0) + value(layer)
    return out


class _Analysis:
    """Datatypes and constant values of a model's tensors, derived on demand (module docstring)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self._dts: dict[str, BaseDataType] = {}
        self._consts: dict[str, np.ndarray | None] = {}

    def const(self, v: ir.Value | None) -> np.ndarray | DepthwiseWeight | None:
        """The constant value of ``v``: an initializer, or a quantizer / data-movement node of constants."""
        if v is None:
            return None
        if v.name in self._consts:
            return self._consts[v.name]
        if isinstance(v.const_value, DepthwiseWeight):  # shape and density are all a layer's cost needs of it
            self._consts[v.name] = v.const_value
            return v.const_value
        value = const_array(v)
        node = v.producer()
        if value is None and node is not None and node.op_type in ("Quant", "BipolarQuant", "Transpose", "Reshape",
                                                                    "Identity"):
            args = [self.const(x) for x in node.inputs]
            if all(a is not None for a in args):
                try:
                    value = _evaluate(node, args)
                except ValueError:  # invalid quantizer parameters (a bad input model): not a known constant
                    value = None
        if value is None or value.size <= _CACHED_ELEMENTS or node is None:
            self._consts[v.name] = value  # parameters; a quantized weight is computed where it is read (once)
        return value

    def datatype(self, v: ir.Value) -> BaseDataType:
        """The datatype of ``v``: its annotation, else derived from its producer (module docstring)."""
        name = v.name
        if name in self._dts:
            return self._dts[name]
        self._dts[name] = _FLOAT32  # guards against cycles in malformed graphs
        dt = _FLOAT32
        if self.model.has_tensor_datatype(name):
            dt = self.model.get_tensor_datatype(name)
        else:
            node = v.producer()
            if node is not None:
                dt = self._derive(node)
        self._dts[name] = dt
        return dt

    def _derive(self, node: ir.Node) -> BaseDataType:
        op = node.op_type
        if op == "BipolarQuant":
            return DataType["BIPOLAR"]
        if op == "Quant":
            scale, zeropt, bits = (self.const(node.inputs[i]) if len(node.inputs) > i else None for i in (1, 2, 3))
            if bits is None or bits.size != 1 or zeropt is None or scale is None or np.any(zeropt != 0):
                return _FLOAT32
            b = float(bits.reshape(-1)[0])
            if not (np.isfinite(b) and b == int(b) and 1 <= b <= MAX_BITWIDTH):  # invalid: a bad input model
                return _FLOAT32
            attr = node.attributes.get("signed")
            signed = bool(attr.value) if attr is not None else True
            bitwidth = int(bits.reshape(-1)[0])
            return int_type(bitwidth, signed) if np.all(scale == 1) else DataType[f"SCALEDINT<{bitwidth}>"]
        if op in _PASS_THROUGH and node.inputs and node.inputs[0] is not None:
            return self.datatype(node.inputs[0])
        if op in _MAC_OPS:
            dts = [self.datatype(x) for x in node.inputs[:2] if x is not None]
            scaled = any(dt.name.startswith("SCALEDINT") for dt in dts)
            if all(dt.is_integer() or dt.name.startswith("SCALEDINT") for dt in dts):
                return DataType["SCALEDINT<32>"] if scaled else DataType["INT32"]
        return _FLOAT32


#: computed constants (quantizer outputs) up to this size are remembered; larger ones (the quantized weights: a
#: second copy of the network's weights) are not
_CACHED_ELEMENTS = 4096


def _evaluate(node: ir.Node, args: list[np.ndarray]) -> np.ndarray | None:

    attrs = {k: a.value for k, a in node.attributes.items()}
    op = node.op_type
    if op == "Quant" and len(args) == 4:
        return quant_rows(args[0], args[1], args[2], args[3], bool(attrs.get("signed", 1)),
                          bool(attrs.get("narrow", 0)), str(attrs.get("rounding_mode", "ROUND")))
    if op == "BipolarQuant" and len(args) == 2:
        return by_rows(bipolar_quant, args[0], args[1])  # its temporaries of a block, as quant_rows
    if op == "Transpose":
        perm = attrs.get("perm")
        return np.transpose(args[0], list(perm) if perm is not None else None)
    if op == "Reshape" and len(args) == 2:
        shape = [d if d != 0 else args[0].shape[i] for i, d in enumerate(args[1].astype(np.int64).tolist())]
        return args[0].reshape(shape)
    if op == "Identity":
        return args[0]
    return None


def _shape(model: Model, v: ir.Value | None, value: np.ndarray | None = None) -> tuple[int, ...] | None:
    if value is not None:
        return tuple(value.shape)
    if v is None:
        return None
    shape = model.get_tensor_shape(v.name)
    if shape is None or any(d is None for d in shape):
        return None
    return tuple(int(d) for d in shape)


def _density(value: np.ndarray | DepthwiseWeight | None) -> float:
    if value is None or value.size == 0:
        return 1.0
    if isinstance(value, DepthwiseWeight):
        return value.density()
    return float(np.count_nonzero(value)) / value.size


def _layer(an: _Analysis, node: ir.Node, discount_sparsity: bool) -> LayerCost | None:
    model = an.model
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None or not node.outputs:
        return None
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    xv, wv = an.const(x), an.const(w)
    x_shape, w_shape, y_shape = _shape(model, x, xv), _shape(model, w, wv), _shape(model, y)
    if x_shape is None or w_shape is None or y_shape is None:
        return None
    out_elems = float(np.prod(y_shape))
    attrs = {k: a.value for k, a in node.attributes.items()}
    if node.op_type == "Conv":
        group = int(attrs.get("group", 1))
        kernel = list(attrs.get("kernel_shape") or w_shape[2:])
        macs = float(x_shape[0] * (y_shape[1] // group) * x_shape[1] * int(np.prod(kernel)) * np.prod(y_shape[2:]))
        weight, w_elems, wdt_source = wv, float(np.prod(w_shape)), w
    else:
        k_dim = x_shape[0] if node.op_type == "Gemm" and int(attrs.get("transA", 0)) else x_shape[-1]
        macs = float(k_dim * out_elems)
        if xv is not None and wv is None:  # the constant is the first operand
            weight, w_elems, wdt_source = xv, float(np.prod(x_shape)), x
            x = w
        elif wv is not None:
            weight, w_elems, wdt_source = wv, float(np.prod(w_shape)), w
        else:  # two dynamic operands: no weight memory
            weight, w_elems, wdt_source = None, 0.0, w
    if discount_sparsity and weight is not None and node.op_type != "XnorPopcountMatMul":  # 0 encodes -1 there
        density = _density(weight)
        macs *= density
        w_elems *= density
    idt, fused = an.datatype(x), _fused_threshold(y)
    acc = _accumulator(node, idt, weight if weight is wv else None)
    return LayerCost(node.name or node.op_type, node.op_type, idt.name, an.datatype(wdt_source).name,
                     an.datatype(y).name, macs, w_elems, out_elems, acc,
                     an.datatype(fused).name if fused is not None else acc)


def _accumulator(node: ir.Node, idt: BaseDataType, weight: Any) -> str:
    """The accumulator datatype FINN sizes for MAC ``node`` from input datatype ``idt`` and its second operand's
    constant value ``weight`` (see :class:`LayerCost`)."""
    if weight is None or not is_integer_type(idt):
        return "-"
    if node.op_type == "XnorPopcountMatMul":  # FINN's binaryXnorMode sizes it as the bipolar weights on {0, 1}
        weight = 2 * np.asarray(weight, dtype=np.float64) - 1
    attrs = {k: a.value for k, a in node.attributes.items()}
    if node.op_type == "Gemm" and int(attrs.get("transA", 0)):
        return "-"
    op = "GemmT" if node.op_type == "Gemm" and int(attrs.get("transB", 0)) else node.op_type
    sums = weight_sums(weight, op)
    if sums is None or not sums[2]:
        return "-"
    lo, hi = float(idt.min()), float(idt.max())
    if node.op_type == "Conv" and zero_padded(node):
        lo, hi = min(lo, 0.0), max(hi, 0.0)  # the padding zeros
    return tightest_datatype(*accumulator_range(lo, hi, sums)).name


def _fused_threshold(y: ir.Value) -> ir.Value | None:
    """The output of the MultiThreshold FINN fuses into the layer producing ``y`` (its only consumer), or None."""
    uses = list(y.uses())
    if len(uses) == 1 and not y.is_graph_output() and uses[0].node.op_type == "MultiThreshold" \
            and uses[0].idx == 0 and uses[0].node.outputs:
        return uses[0].node.outputs[0]
    return None


def inference_cost(model: Any, *, discount_sparsity: bool = True) -> InferenceCost:
    """The inference cost of ``model`` (a :class:`finnlite.Model` or anything it loads from; not modified).
    Shapes missing from the graph are inferred on a copy."""
    m = as_model(model)
    if any(n.op_type in _MAC_OPS and n.outputs and _shape(m, n.outputs[0]) is None for n in m.graph):
        m = m.copy()
        m.infer_shapes()
    an = _Analysis(m)
    cost = InferenceCost(discount_sparsity=discount_sparsity)
    unsupported: set[str] = set()
    for node in m.graph:
        if node.op_type in _MAC_OPS:
            layer = _layer(an, node, discount_sparsity)
            if layer is None:
                unsupported.add(f"{node.op_type} (unknown shapes)")
            else:
                cost.layers.append(layer)
        elif node.op_type not in ZERO_COST_OPS:
            unsupported.add(node.op_type)
    cost.unsupported = sorted(unsupported)
    return cost


def derived_datatypes(model: Any) -> Callable[[ir.Value], BaseDataType]:
    """``value -> datatype`` for ``model``'s tensors: the annotation, else derived from the producer as the module
    docstring says (what the report colours a node by). The model is read, not modified; results are cached."""
    return _Analysis(as_model(model)).datatype


def bits(dt: str) -> int | None:
    """The bit width of datatype name ``dt`` (``INT4`` -> 4, ``SCALEDINT<8>`` -> 8), None for ``-`` or an unknown
    name."""
    try:
        return DataType[dt].bitwidth()
    except (KeyError, ValueError, AttributeError):
        return None


def datatype_histogram(model: Any) -> dict[str, dict[str, int]]:
    """How many tensors carry each datatype annotation: ``{"weights": {...}, "activations": {...}}`` (weights are
    initializers; activations are graph inputs and node outputs), most frequent first."""
    m = as_model(model)
    weights: dict[str, int] = {}
    acts: dict[str, int] = {}
    for name in m.graph.initializers:
        if m.has_tensor_datatype(name):
            dt = m.get_tensor_datatype(name).name
            weights[dt] = weights.get(dt, 0) + 1
    values = list(m.graph.inputs) + [o for n in m.graph for o in n.outputs]
    for v in values:
        if v.name and m.has_tensor_datatype(v.name):
            dt = m.get_tensor_datatype(v.name).name
            acts[dt] = acts.get(dt, 0) + 1
    order = lambda d: dict(sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))  # noqa: E731
    return {"weights": order(weights), "activations": order(acts)}
