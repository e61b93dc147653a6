"""Quant (alias IntQuant): uniform integer quantization, as exported by Brevitas and executed by qonnx.

Inputs ``x, scale, zeropoint, bitwidth``; scale and zero-point broadcast against ``x`` (per tensor or per
channel), the bitwidth is a single integer >= 1. Attributes ``signed``, ``narrow`` (0/1, both required as in qonnx)
and ``rounding_mode`` (default ``ROUND``)::

    q = R(clip(x / scale + zeropoint, qmin, qmax))        y = (q - zeropoint) * scale

with the bounds of :func:`min_int` / :func:`max_int` and ``R`` one of :data:`ROUNDING_MODES`. Clipping comes
before rounding (the bounds are integers, so the order does not matter for a monotone ``R``). A 1-bit *signed*
quantizer is bipolar: ``q = +1`` where ``x / scale + zeropoint >= 0`` and ``-1`` elsewhere, whatever the rounding
mode and ``narrow``; a 1-bit unsigned one is binary ({0, 1}) and takes the general path.

The kernel performs qonnx's ``int_quant`` operations in the same order on the same dtypes, so float32 results are
bit-identical to qonnx's, signed zeros and NaNs included. Note what that implies for ``HALF_UP``/``HALF_DOWN``: they
are ``sign(v) * floor(|v| + 0.5)`` and ``sign(v) * ceil(|v| - 0.5)`` evaluated in the input's float type, so the
largest float32 below 0.5 rounds *up* under ``HALF_UP`` (``|v| + 0.5`` rounds to 1.0), as in qonnx.

The op's output is float32 (qonnx casts to float32), or float64 for a float64 input.

Output datatype, as qonnx infers it: with constant scale, zero-point and a 0-d bitwidth, an all-zero zero-point
and an all-one scale give INTb/UINTb (BIPOLAR/BINARY for 1 bit), a zero zero-point and another scale give
SCALEDINT<b>; anything else (unknown parameters, non-zero zero-point, non-scalar bitwidth) gives FLOAT32.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from custom_ops.base import CustomOp
from custom_ops.common import (MAX_BITWIDTH, Shape, by_rows, check_broadcast, check_finite, check_scale, flag_attr,
                               float_output, scalar_bitwidth, shape_of)
from custom_ops.registry import register, register_alias
from finnlite.core.datatypes import BaseDataType, DataType, int_type

RoundingFunction = Callable[[np.ndarray], np.ndarray]


def _round_up(v: np.ndarray) -> np.ndarray:
    """Away from zero."""
    return np.sign(v) * np.ceil(np.abs(v))


def _round_half_up(v: np.ndarray) -> np.ndarray:
    """To nearest, ties away from zero."""
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def _round_half_down(v: np.ndarray) -> np.ndarray:
    """To nearest, ties towards zero."""
    return np.sign(v) * np.ceil(np.abs(v) - 0.5)


#: qonnx's rounding modes (names are matched case-insensitively): ROUND = HALF_EVEN is to nearest with ties to
#: even; CEIL and FLOOR towards +inf and -inf; UP away from zero; DOWN towards zero; HALF_UP and HALF_DOWN to
#: nearest with ties away from and towards zero.
ROUNDING_MODES: dict[str, RoundingFunction] = {
    "ROUND": np.round,
    "HALF_EVEN": np.round,
    "CEIL": np.ceil,
    "FLOOR": np.floor,
    "UP": _round_up,
    "DOWN": np.fix,
    "HALF_UP": _round_half_up,
    "HALF_DOWN": _round_half_down,
}


def canonical_rounding_mode(mode: str) -> str:
    """The key of :data:`ROUNDING_MODES` for ``mode`` (any case); ``ValueError`` for an unknown mode."""
    key = str(mode).upper()
    if key not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding mode '{mode}' (known: {', '.join(ROUNDING_MODES)})")
    return key


def rounding_function(mode: str) -> RoundingFunction:
    """The numpy rounding function of ``mode`` (any case); ``ValueError`` for an unknown mode."""
    return ROUNDING_MODES[canonical_rounding_mode(mode)]


def min_int(signed: bool, narrow: bool, bitwidth: int) -> int:
    """The least integer of a ``bitwidth``-bit quantizer: ``-2^(b-1)`` (``+1`` if narrow) if signed, else 0."""
    if not signed:
        return 0
    return -(1 << (int(bitwidth) - 1)) + (1 if narrow else 0)


def max_int(signed: bool, narrow: bool, bitwidth: int) -> int:
    """The greatest integer of a ``bitwidth``-bit quantizer: ``2^(b-1) - 1`` if signed, else ``2^b - 1``
    (``- 1`` more if narrow; narrow only narrows the lower end of a signed range)."""
    if signed:
        return (1 << (int(bitwidth) - 1)) - 1
    return (1 << int(bitwidth)) - 1 - (1 if narrow else 0)


def _as_bitwidth(bitwidth: int | np.ndarray) -> int:
    arr = np.asarray(bitwidth)
    if arr.size != 1:
        raise ValueError(f"bitwidth must be a single value, got shape {arr.shape}")
    bits = arr.reshape(()).item()
    if not np.isfinite(bits) or bits != int(bits) or not 1 <= bits <= MAX_BITWIDTH:
        raise ValueError(f"bitwidth must be an integer from 1 to {MAX_BITWIDTH}, got {bits!r}")
    return int(bits)


def clip_to_range(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``v`` with values above ``hi`` replaced by ``hi`` and below ``lo`` by ``lo`` (bounds in ``v``'s dtype);
    NaNs and signed zeros pass unchanged."""
    v = np.asarray(v)
    hi_v = np.asarray(hi).astype(v.dtype)
    lo_v = np.asarray(lo).astype(v.dtype)
    v = np.where(v > hi_v, hi_v, v)
    return np.where(v < lo_v, lo_v, v)


def quant_integers(x: np.ndarray, scale: np.ndarray | float, zeropoint: np.ndarray | float,
                   bitwidth: int | np.ndarray, signed: bool, narrow: bool, rounding_mode: str = "ROUND") -> np.ndarray:
    """The integers ``q = R(clip(x / scale + zeropoint, qmin, qmax))`` of qonnx's Quant (±1 for a bipolar one), in
    numpy's promotion of the inputs' dtypes: the first half of :func:`quant`."""
    bits = _as_bitwidth(bitwidth)
    v = np.asarray(x) / scale
    v = v + zeropoint
    if bits == 1 and signed:
        v = np.asarray(v)
        one = np.ones(v.shape, dtype=v.dtype)
        return np.where(v >= 0.0, one, -one)
    return rounding_function(rounding_mode)(clip_to_range(v, min_int(signed, narrow, bits),
                                                          max_int(signed, narrow, bits)))


def quant(x: np.ndarray, scale: np.ndarray | float, zeropoint: np.ndarray | float, bitwidth: int | np.ndarray,
          signed: bool, narrow: bool, rounding_mode: str = "ROUND") -> np.ndarray:
    """qonnx's Quant on numpy arrays (see the module docstring). Computes in numpy's promotion of the inputs'
    dtypes (float32 for float32 inputs) and returns that dtype."""
    y = quant_integers(x, scale, zeropoint, bitwidth, signed, narrow, rounding_mode) - zeropoint
    return np.asarray(y * scale)


def quant_rows(x: np.ndarray, scale: np.ndarray | float, zeropoint: np.ndarray | float, bitwidth: int | np.ndarray,
               signed: bool, narrow: bool, rounding_mode: str = "ROUND", block: int = 1 << 16) -> np.ndarray:
    """:func:`quant`, computed over blocks of about ``block`` elements of rows (axis 0): the same values (the op is
    elementwise), with the temporaries of a block instead of five arrays of the weight's size."""
    return by_rows(lambda a, s, z: quant(a, s, z, bitwidth, signed, narrow, rounding_mode), x, scale, zeropoint,
                   block=block)


def quant_datatype(bitwidth: int, signed: bool, scale: np.ndarray | None,
                   zeropoint: np.ndarray | None) -> BaseDataType:
    """The output datatype qonnx gives a Quant with these (constant) parameters; FLOAT32 if one is unknown."""
    if scale is None or zeropoint is None or not np.all(np.asarray(zeropoint) == 0):
        return DataType["FLOAT32"]
    if np.all(np.asarray(scale) == 1):
        return int_type(bitwidth, signed)
    return DataType[f"SCALEDINT<{bitwidth}>"]


@register
class Quant(CustomOp):
    """Uniform integer quantization (module docstring)."""

    op_type = "Quant"
    attr_spec = {
        "signed": ("i", True, 1),
        "narrow": ("i", True, 1),
        "rounding_mode": ("s", False, "ROUND"),
    }
    num_inputs = (4, 4)

    def validate_attrs(self) -> None:
        self.signed = flag_attr(self, "signed")
        self.narrow = flag_attr(self, "narrow")
        try:
            self.rounding_mode = canonical_rounding_mode(self.attrs["rounding_mode"])
        except ValueError as exc:
            raise self.fail(str(exc)) from None

    def validate_inputs(self, inputs: Sequence[np.ndarray | None]) -> None:
        self.check_num_inputs(len(inputs))
        x, scale, zeropoint, bitwidth = inputs
        check_scale(self, scale, "scale")
        check_finite(self, zeropoint, "zero-point")
        scalar_bitwidth(self, bitwidth, "bitwidth")
        x_shape = shape_of(x)
        check_broadcast(self, x_shape, shape_of(scale), "scale")
        check_broadcast(self, x_shape, shape_of(zeropoint), "zero-point")
        check_broadcast(self, x_shape, shape_of(bitwidth), "bitwidth")

    def validate_strict(self, inputs: Sequence[np.ndarray | None]) -> None:
        """Also: a constant zero-point lies in the integer range ``[qmin, qmax]`` (else the real value 0 is not
        representable and no exporter writes it)."""
        self.validate_inputs(inputs)
        zeropoint, bitwidth = inputs[2], inputs[3]
        if zeropoint is None or bitwidth is None:
            return
        bits = scalar_bitwidth(self, bitwidth, "bitwidth")
        assert bits is not None
        lo, hi = min_int(self.signed, self.narrow, bits), max_int(self.signed, self.narrow, bits)
        z = np.asarray(zeropoint, dtype=np.float64)
        outside = (z < lo) | (z > hi)
        if np.any(outside):
            first = float(z.reshape(-1)[int(np.argmax(outside.reshape(-1)))])
            kind = f"{'signed' if self.signed else 'unsigned'}{' narrow' if self.narrow else ''} {bits}-bit"
            raise self.fail(f"zero-point {first:g} is outside the {kind} integer range [{lo}, {hi}]")

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.validate_inputs(inputs)
        x, scale, zeropoint, bitwidth = (np.asarray(v) for v in inputs)
        y = quant(x, scale, zeropoint, bitwidth, self.signed, self.narrow, self.rounding_mode)
        return [float_output(x, y)]

    def infer_shapes(self, shapes: Sequence[Shape | None],
                     values: Sequence[np.ndarray | None]) -> list[Shape | None]:
        self.check_num_inputs(len(shapes))
        for shape, what in zip(shapes[1:], ("scale", "zero-point", "bitwidth")):
            check_broadcast(self, shapes[0], shape, what)
        return [None if shapes[0] is None else tuple(shapes[0])]

    def infer_datatypes(self, dtypes: Sequence[BaseDataType | None],
                        values: Sequence[np.ndarray | None]) -> list[BaseDataType]:
        self.validate_inputs(values)
        _, scale, zeropoint, bitwidth = values
        if bitwidth is None or np.ndim(bitwidth) != 0:
            return [DataType["FLOAT32"]]
        return [quant_datatype(scalar_bitwidth(self, bitwidth, "bitwidth"), self.signed, scale, zeropoint)]


register_alias("IntQuant", Quant)
