"""Trunc: dropping low-order bits of a quantized value (Brevitas' TruncIntQuant), in qonnx's two versions.

**Version 1** (5 inputs ``x, scale, zeropoint, input_bitwidth, output_bitwidth``; attribute ``rounding_mode``)::

    v = round_half_even(x / scale + zeropoint)
    y = (R(v / 2^(input_bitwidth - output_bitwidth)) - zeropoint) * scale

**Version 2** (6 inputs ``x, scale, zeropoint, input_bitwidth, output_scale, output_bitwidth``; attributes
``rounding_mode``, ``signed`` (default 1), ``narrow`` (default 0)). The shift comes from the ratio of the scales,
rounded to a power of two, and the result is clipped to the output range before rounding::

    t = 2^round(log2(output_scale / scale))
    v = round_half_even(x / scale + zeropoint) / t
    y = (R(clip(v, min_int, max_int)) - zeropoint / t) * output_scale

with ``min_int``/``max_int`` of (signed, narrow, output_bitwidth) as in Quant (no bipolar case here) and ``R``
the ``rounding_mode`` (required, as in qonnx; modes as Quant's). The kernels perform qonnx's operations in the same
order (bit-identical in float32). The op's output is float32, or float64 for a float64 input; its datatype is
FLOAT32 (as qonnx infers it) and its shape is the input's.

**Which version.** qonnx picks the class by the model's opset import of the node's domain with "since version"
semantics (the highest version <= the imported one: opset 1 is version 1, opset >= 2 is version 2; a domain not
imported counts as 1). Our :class:`CustomOp` is built from (name, attrs) only, so :class:`Trunc` takes an optional
keyword ``opset_version``:

* given (the caller read the model's ``opset_import`` for the node's domain, 1 if absent, as qonnx does), it fixes
  the version, and a node whose input count does not fit that version is an error;
* ``None`` (what :func:`custom_ops.registry.make_op` passes), the version is the one the node's input count
  implies: 5 inputs is version 1, 6 is version 2. The counts differ, so this never picks a version that qonnx
  could execute differently.

In version 1 the attributes ``signed`` and ``narrow`` do not exist; giving them is an error (qonnx ignores them).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from custom_ops.base import CustomOp, attrs_of
from custom_ops.common import (Shape, check_broadcast, check_finite, check_scale, flag_attr, float_output,
                               scalar_bitwidth, shape_of)
from custom_ops.quant import canonical_rounding_mode, clip_to_range, max_int, min_int, rounding_function
from custom_ops.registry import register
from finnlite.core.datatypes import BaseDataType, DataType
from finnlite.core.errors import OpError

#: the number of inputs of each Trunc version
TRUNC_INPUTS = {1: 5, 2: 6}
_V2_ATTRS = ("signed", "narrow")


def trunc_version(opset_version: int | None) -> int | None:
    """The Trunc version qonnx uses under an imported opset ``opset_version`` ("since version": the highest
    version <= it); None for None. ``ValueError`` for an opset below 1."""
    if opset_version is None:
        return None
    if int(opset_version) < 1:
        raise ValueError(f"no Trunc version for opset {opset_version}; the lowest is 1")
    return max(v for v in TRUNC_INPUTS if v <= int(opset_version))


def trunc_v1(x: np.ndarray, scale: np.ndarray | float, zeropoint: np.ndarray | float, input_bitwidth: np.ndarray,
             output_bitwidth: np.ndarray, rounding_mode: str = "FLOOR") -> np.ndarray:
    """Trunc version 1 (module docstring), in numpy's dtype promotion of the inputs."""
    v = np.asarray(x) / scale
    v = v + zeropoint
    v = np.round(v)
    v = v / 2.0 ** (np.asarray(input_bitwidth) - np.asarray(output_bitwidth))
    v = rounding_function(rounding_mode)(v)
    v = v - zeropoint
    return np.asarray(v * scale)


def trunc_v2(x: np.ndarray, scale: np.ndarray | float, zeropoint: np.ndarray | float, input_bitwidth: np.ndarray,
             output_scale: np.ndarray | float, output_bitwidth: np.ndarray, signed: bool = True,
             narrow: bool = False, rounding_mode: str = "FLOOR") -> np.ndarray:
    """Trunc version 2 (module docstring), in numpy's dtype promotion of the inputs. ``input_bitwidth`` does not
    enter the computation (as in qonnx)."""
    bits = int(np.asarray(output_bitwidth).reshape(()).item())
    v = np.asarray(x) / scale
    v = v + zeropoint
    v = np.round(v)
    shift = 2 ** np.round(np.log2(output_scale / np.asarray(scale)))
    v = v / shift
    v = clip_to_range(v, min_int(signed, narrow, bits), max_int(signed, narrow, bits))
    v = rounding_function(rounding_mode)(v)
    v = v - zeropoint / shift
    return np.asarray(v * output_scale)


@register
class Trunc(CustomOp):
    """Truncation of low-order bits, version 1 or 2 (module docstring)."""

    op_type = "Trunc"
    attr_spec = {
        "rounding_mode": ("s", True, "FLOOR"),
        "signed": ("i", False, 1),
        "narrow": ("i", False, 0),
    }
    num_inputs = (5, 6)

    def __init__(self, name: str, attrs: dict[str, Any] | None = None, opset_version: int | None = None) -> None:
        try:
            self.fixed_version = trunc_version(opset_version)
        except ValueError as exc:
            raise OpError(f"Trunc: {exc}", node=name or "<unnamed Trunc>") from None
        self.given_attrs = frozenset(attrs or {})
        super().__init__(name, attrs)

    @classmethod
    def from_node(cls, node: Any, opset_version: int | None = None) -> "Trunc":
        """The op for a node, in the version the model's opset import for its domain selects."""
        return cls(node.name, attrs_of(node), opset_version=opset_version)

    def validate_attrs(self) -> None:
        self.signed = flag_attr(self, "signed")
        self.narrow = flag_attr(self, "narrow")
        try:
            self.rounding_mode = canonical_rounding_mode(self.attrs["rounding_mode"])
        except ValueError as exc:
            raise self.fail(str(exc)) from None
        if self.fixed_version == 1:
            self._check_v1_attrs()

    def _check_v1_attrs(self) -> None:
        extra = sorted(self.given_attrs & set(_V2_ATTRS))
        if extra:
            raise self.fail(f"attribute(s) {extra} exist only in Trunc version 2, not in version 1")

    def version_for(self, num_inputs: int) -> int:
        """The version this node runs as, given its number of inputs (module docstring)."""
        self.check_num_inputs(num_inputs)
        if self.fixed_version is None:
            version = 1 if num_inputs == TRUNC_INPUTS[1] else 2
        else:
            version = self.fixed_version
            if num_inputs != TRUNC_INPUTS[version]:
                raise self.fail(f"Trunc version {version} takes {TRUNC_INPUTS[version]} inputs, got {num_inputs}")
        if version == 1:
            self._check_v1_attrs()
        return version

    def validate_inputs(self, inputs: Sequence[np.ndarray | None]) -> None:
        version = self.version_for(len(inputs))
        x_shape = shape_of(inputs[0])
        check_scale(self, inputs[1], "scale")
        check_finite(self, inputs[2], "zero-point")
        scalar_bitwidth(self, inputs[3], "input bitwidth")
        if version == 1:
            scalar_bitwidth(self, inputs[4], "output bitwidth")
            params = ("scale", "zero-point", "input bitwidth", "output bitwidth")
        else:
            check_scale(self, inputs[4], "output scale")
            scalar_bitwidth(self, inputs[5], "output bitwidth")
            params = ("scale", "zero-point", "input bitwidth", "output scale", "output bitwidth")
        for value, what in zip(inputs[1:], params):
            check_broadcast(self, x_shape, shape_of(value), what)

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.validate_inputs(inputs)
        arrays = [np.asarray(v) for v in inputs]
        if len(arrays) == TRUNC_INPUTS[1]:
            y = trunc_v1(*arrays, rounding_mode=self.rounding_mode)
        else:
            y = trunc_v2(*arrays, signed=self.signed, narrow=self.narrow, rounding_mode=self.rounding_mode)
        return [float_output(arrays[0], y)]

    def infer_shapes(self, shapes: Sequence[Shape | None],
                     values: Sequence[np.ndarray | None]) -> list[Shape | None]:
        self.version_for(len(shapes))
        for shape in shapes[1:]:
            check_broadcast(self, shapes[0], shape, "parameter")
        return [None if shapes[0] is None else tuple(shapes[0])]

    def infer_datatypes(self, dtypes: Sequence[BaseDataType | None],
                        values: Sequence[np.ndarray | None]) -> list[BaseDataType]:
        self.validate_inputs(values)
        return [DataType["FLOAT32"]]
