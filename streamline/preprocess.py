"""Input preprocessing for a first layer that reads the float input (no input quantizer, as in MobileNet-v1 and
ResNet-18 exports): the graph input becomes an integer-annotated tensor (``UINT8`` pixels) and the preprocessing
``(x·scale − mean) / std`` (per channel) is put in front of the graph, where streamlining moves it into the first
layer, so that its Conv/MatMul reads the integers.

:func:`insert_preprocessing` edits the model before the pipeline runs; the reference the pipeline is verified against
is the model *with* the preprocessing (the original fed with the same preprocessing). The inserted nodes compute
the formula as written, in float32: ``Mul(scale) → Sub(mean) → Div(std)``; the tidy and streamlining stages turn
them into one scalar Mul and a per-channel Add (exactly).

Before a zero-padded first Conv followed by thresholds, :class:`streamline.border.AbsorbBorderIntoThresholds` takes
the scalar Mul and the per-channel Add into an integer per-position Add after the Conv and integer thresholds
(exact; the padded border sees 0, not the mean). Elsewhere :class:`MoveAddPastPaddedConv` moves the per-channel Add
past a zero-padded first Conv as a float per-position Add; the scalar Mul passes it with ``MoveMulPastLinear``. A
per-channel ``std`` gives a per-channel Mul, which cannot pass a Conv with integer
weights (it would scale input channels inside each output's sum): the first layer then stays float, and the
integer-only report says why — use one ``std`` for every channel (Brevitas' ImageNet examples use 0.226).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import onnx_ir as ir

from finnlite.core.datatypes import is_integer_type, parse_datatype
from finnlite.core.errors import ConfigError, DataTypeError
from finnlite.core.graphutil import is_standard_domain, rank_of, zero_padded
from finnlite.core.passes import Rule, register_pass
from finnlite.core.shapes import const_array
from streamline.exact import LinearInput, channel_vector, exact_value, linear_input

if TYPE_CHECKING:
    from finnlite.core.model import Model

__all__ = ["Preprocessing", "parse_number", "insert_preprocessing", "integer_input_scale", "MoveAddPastPaddedConv"]


def parse_number(text: Any, what: str = "value") -> float:
    """A number from a float or a string such as ``"0.5"`` or ``"1/255"``; :class:`ConfigError` otherwise."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        try:
            value = float(Fraction(str(text).strip()))
        except (ValueError, ZeroDivisionError):
            raise ConfigError(f"{what}: '{text}' is not a number (e.g. 0.5 or 1/255)") from None
    if not np.isfinite(value):
        raise ConfigError(f"{what}: '{text}' is not finite")
    return value


@dataclass(frozen=True)
class Preprocessing:
    """``x_float = (x·scale − mean[c]) / std[c]`` for the integer input ``x`` of datatype ``input_datatype``.
    ``mean`` and ``std`` hold one value, or one per channel (axis 1); ``input`` names the graph input (default: the
    only one)."""

    input_datatype: str = "UINT8"
    scale: float = 1.0
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    input: str | None = None

    def __post_init__(self) -> None:
        try:
            dt = parse_datatype(self.input_datatype)
        except DataTypeError:
            raise ConfigError(f"preprocessing: unknown input datatype '{self.input_datatype}'") from None
        if not is_integer_type(dt):
            raise ConfigError(f"preprocessing: the input datatype must be an integer type, not {dt.name}")
        if not (np.isfinite(self.scale) and self.scale > 0):
            raise ConfigError(f"preprocessing: the input scale must be > 0, not {self.scale}")
        if self.std is not None and not all(np.isfinite(s) and s > 0 for s in self.std):
            raise ConfigError(f"preprocessing: every std must be > 0, got {list(self.std)}")
        if self.mean is not None and not all(np.isfinite(m) for m in self.mean):
            raise ConfigError(f"preprocessing: every mean must be finite, got {list(self.mean)}")

    def describe(self) -> str:
        parts = [f"{parse_datatype(self.input_datatype).name} input", f"x*{self.scale:.6g}"]
        if self.mean is not None:
            parts.append(f"- mean {list(self.mean)}")
        if self.std is not None:
            parts.append(f"/ std {list(self.std)}")
        return " ".join(parts)


def _per_channel(values: Sequence[float] | None, channels: int | None, rank: int, what: str, name: str
                 ) -> np.ndarray | None:
    if values is None:
        return None
    arr = np.asarray(values, np.float32)
    if arr.size == 1 or np.all(arr == arr[0]):
        return np.asarray(arr[0], np.float32)
    if channels is None or arr.size != channels:
        raise ConfigError(f"preprocessing: {arr.size} {what} values for input '{name}' with "
                          f"{channels if channels is not None else 'an unknown number of'} channels (axis 1)")
    return arr.reshape([channels] + [1] * (rank - 2))


def insert_preprocessing(model: "Model", pre: Preprocessing) -> list[ir.Node]:
    """Put ``pre`` in front of the graph (module docstring): the graph input keeps its name, shape and float32
    element type, is annotated with ``pre.input_datatype``, and its former consumers read the preprocessed
    tensor. Returns the inserted nodes (none if the preprocessing is the identity)."""
    names = model.input_names
    if pre.input is None and len(names) != 1:
        raise ConfigError(f"preprocessing: the model has inputs {names}; say which one with 'input'")
    name = pre.input or names[0]
    if name not in names:
        raise ConfigError(f"preprocessing: the model has no input '{name}' (inputs: {names})")
    x = model.value(name)
    shape = model.get_tensor_shape(name)
    rank = len(shape) if shape is not None else 0
    channels = shape[1] if shape is not None and rank >= 2 else None
    mean = _per_channel(pre.mean, channels, rank, "mean", name)
    std = _per_channel(pre.std, channels, rank, "std", name)
    steps = []
    if pre.scale != 1.0:
        steps.append(("Mul", np.asarray(pre.scale, np.float32), "scale"))
    if mean is not None and np.any(mean != 0):
        steps.append(("Sub", mean, "mean"))
    if std is not None and np.any(std != 1):
        steps.append(("Div", std, "std"))
    model.set_tensor_datatype(name, parse_datatype(pre.input_datatype))
    if not steps:
        return []
    uses = list(x.uses())
    nodes, cur = [], x
    for op, const, what in steps:
        c = model.add_initializer(const, prefix=f"{name}_preprocess_{what}")
        out = model.make_value_like(x, prefix=f"{name}_preprocess_{what}")
        nodes.append(ir.Node("", op, [cur, c], outputs=[out], name=f"{name}_preprocess_{op}"))
        cur = out
    for use in uses:
        use.node.replace_input_with(use.idx, cur)
    first = next(iter(model.graph), None)
    if first is None:
        model.graph.extend(nodes)
    else:
        model.graph.insert_before(first, nodes)
    if x.is_graph_output():
        raise ConfigError(f"preprocessing: input '{name}' is also a graph output")
    return nodes


def integer_input_scale(model: "Model", v: ir.Value, *, single_use: bool = True
                        ) -> tuple[ir.Value, Fraction, list[ir.Node]] | None:
    """``(x, s, muls)`` if ``v = s·x`` for an integer-annotated tensor ``x`` through scalar Muls by constants
    (``muls``, nearest first; ``s`` their exact product), each read only by the next and no graph output when
    ``single_use`` (a rule that removes them); None otherwise."""
    s, muls = Fraction(1), []
    for _ in range(8):
        if model.has_tensor_datatype(v.name) and is_integer_type(model.get_tensor_datatype(v.name)):
            return v, s, muls
        p = v.producer()
        if p is None or p.op_type != "Mul" or not is_standard_domain(p.domain) or len(p.inputs) != 2:
            return None
        c = const_array(p.inputs[1])
        if c is None or c.size != 1 or (single_use and (len(v.uses()) != 1 or v.is_graph_output())):
            return None
        s *= Fraction(exact_value(p, c).ravel()[0])
        muls.append(p)
        v = p.inputs[0]
    return None


def _thresholds_ahead(conv: ir.Node) -> bool:
    """True if the Conv's output reaches a MultiThreshold through at least one single-use Relu or Mul/Add by a
    scalar or per-channel constant: the absorb rules will clear them, and AbsorbBorderIntoThresholds then takes the
    Add exactly."""
    v, steps = conv.outputs[0], 0
    for _ in range(8):
        uses = list(v.uses())
        if len(uses) != 1 or v.is_graph_output():
            return False
        nxt = uses[0].node
        if nxt.op_type == "MultiThreshold":
            return steps > 0
        if not is_standard_domain(nxt.domain) or nxt.op_type not in ("Mul", "Add", "Relu"):
            return False
        if nxt.op_type != "Relu":
            c = next((const_array(i) for i in nxt.inputs if i is not None and const_array(i) is not None), None)
            rank = len(v.shape) if v.shape is not None else 0
            if c is None or rank == 0 or channel_vector(c, rank, 1) is None:
                return False
        v, steps = nxt.outputs[0], steps + 1
    return False


@dataclass(frozen=True, slots=True, eq=False)
class PaddedConvBias:
    """A bias Add (``add``; its constant per input channel, ``bias``) before a zero-padded ``conv`` with constant
    ``weight``, whose input has the static ``shape``."""

    conv: ir.Node
    add: LinearInput
    bias: np.ndarray
    weight: np.ndarray
    shape: tuple[int, ...]


@register_pass(group="reorder")
class MoveAddPastPaddedConv(Rule):
    """Conv(Add(x, b), W) with zero padding → Add(Conv(x, W), B), ``B[o, h, w] = Σ_{c, k inside} W[o, c, k]·b_c``.

    Algebra: pad₀(x + b) = pad₀(x) + pad₀(b·1), and the Conv is linear, so Conv(pad₀(x + b)) = Conv(pad₀(x)) +
    Conv(pad₀(b·1)); the second term is a constant that varies along the border (the padded taps see 0, not b),
    a per-position bias [1, O, H', W']. ``B`` is computed in float64 from integer tap sums and the exact b, and
    rounded to float32 (the Add it makes stays a float node: a per-position bias cannot become thresholds).
    Conditions: b scalar or per input channel; the Add feeds only the Conv; W constant; x an integer tensor, possibly
    scaled by scalar Muls (the preprocessing of an integer input, the one case where moving the Add lets the Conv
    read integers; ``MoveAddPastConv`` handles unpadded Convs). Where thresholds follow the Conv,
    :class:`streamline.border.AbsorbBorderIntoThresholds` takes the Add exactly and integer instead: this rule
    waits while Mul/Add/Relu nodes the absorb rules clear stand between, and applies where that rule does not."""

    op_types = ("Conv",)

    def match(self, model: Any, node: ir.Node) -> Any:
        lin = linear_input(node, 0, ("Add",))
        w = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
        if lin is None or w is None or not zero_padded(node):
            return None
        if integer_input_scale(model, lin.data, single_use=False) is None:
            return None
        if _thresholds_ahead(node):
            return self.miss(node, "waiting for the thresholds after the Conv to take the border exactly "
                                   "(AbsorbBorderIntoThresholds)")
        rank = rank_of(node.inputs[0], constants=False)
        shape = model.get_tensor_shape(node.inputs[0].name)
        if rank is None or shape is None or any(d is None for d in shape) or node.outputs[0].shape is None:
            return self.miss(node, "unknown shapes")
        vec = channel_vector(lin.exact(), rank, 1)
        if vec is None:
            return self.miss(node, "the Add before the Conv varies along a spatial axis")
        return PaddedConvBias(node, lin, vec, w, tuple(shape))

    def rewrite(self, model: Any, match: PaddedConvBias) -> None:
        node, lin, vec, w, shape = match.conv, match.add.node, match.bias, match.weight, match.shape
        b = np.broadcast_to(np.array([float(v) for v in vec], np.float64), (shape[1],))
        ones = np.ones([1, shape[1]] + list(shape[2:]), np.float64) * b.reshape([1, -1] + [1] * (len(shape) - 2))
        bias = _conv64(node, ones, w.astype(np.float64)).astype(np.float32)
        node.replace_input_with(0, match.add.data)
        model.remove_node(lin)
        y = node.outputs[0]
        out = model.make_value_like(y)
        model.replace_uses(y, out)
        c = model.add_initializer(bias, prefix=f"{lin.name}_border")
        model.graph.insert_after(node, ir.Node("", "Add", [y, c], outputs=[out], name=f"{lin.name}_past_conv"))


def _conv64(node: ir.Node, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The Conv of ``node`` (its attributes) on float64 arrays, by the executor's float64 kernel."""
    import onnx

    from custom_ops.float64_ops import conv

    attrs = [a for a in (ir.serde.serialize_attribute(attr) for attr in node.attributes.values())]
    proto = onnx.helper.make_node("Conv", ["x", "w"], ["y"], name=node.name)
    proto.attribute.extend(attrs)
    return conv(proto, [x, w])[0]
