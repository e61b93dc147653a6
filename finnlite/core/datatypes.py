"""Datatypes: qonnx's ``DataType`` reused as is, so that our annotations are the ones qonnx and FINN read.

``DataType["INT4"]``, ``DataType["UINT2"]``, ``DataType["BIPOLAR"]``, ``DataType["BINARY"]``, ``DataType["TERNARY"]``,
``DataType["FIXED<8,4>"]``, ``DataType["SCALEDINT<8>"]``, ``DataType["FLOAT32"]`` each have ``min()``, ``max()``,
``bitwidth()``, ``signed()``, ``allowed(x)`` and ``is_integer()``. This module adds the helpers the passes need.
"""

from __future__ import annotations

import numpy as np
from qonnx.core.datatype import BaseDataType, DataType

from finnlite.core.errors import DataTypeError

__all__ = ["DataType", "BaseDataType", "parse_datatype", "smallest_int_type", "tightest_datatype", "int_type",
           "datatype_of_values", "is_integer_type"]


def parse_datatype(name: str | BaseDataType) -> BaseDataType:
    """The datatype named ``name`` (``"INT4"``, ``"BIPOLAR"``, ...); a ``DataTypeError`` for an unknown name."""
    if isinstance(name, BaseDataType):
        return name
    try:
        return DataType[str(name)]
    except (KeyError, ValueError, AttributeError) as exc:
        raise DataTypeError(f"unknown datatype '{name}'") from exc


def int_type(bits: int, signed: bool) -> BaseDataType:
    """INTn or UINTn for ``bits`` >= 2. A 1-bit quantizer produces BIPOLAR (signed, {-1, +1}) or BINARY
    (unsigned, {0, 1}) values in qonnx's Quant semantics, so those are returned for ``bits`` == 1."""
    if bits < 1:
        raise DataTypeError(f"bitwidth must be at least 1, got {bits}")
    if bits == 1:
        return DataType["BIPOLAR"] if signed else DataType["BINARY"]
    return DataType[f"INT{bits}" if signed else f"UINT{bits}"]


def smallest_int_type(vmin: float, vmax: float) -> BaseDataType:
    """The narrowest INTn/UINTn (or BINARY) that holds every integer in ``[vmin, vmax]``.

    Unlike qonnx's ``DataType.get_smallest_possible`` this never returns BIPOLAR or TERNARY for a range that
    merely fits them, since those types do not hold every integer of the range ({-1, 1} lacks 0)."""
    vmin, vmax = int(np.floor(vmin)), int(np.ceil(vmax))
    if vmin > vmax:
        raise DataTypeError(f"empty range [{vmin}, {vmax}]")
    if vmin >= 0:
        if vmax <= 1:
            return DataType["BINARY"]
        return DataType[f"UINT{max(int(vmax).bit_length(), 1)}"]
    bits = 1
    while not (-(1 << (bits - 1)) <= vmin and vmax <= (1 << (bits - 1)) - 1):
        bits += 1
    return DataType[f"INT{max(bits, 2)}"]


def is_integer_type(dt: BaseDataType | None) -> bool:
    """True for integer-valued types (INTn, UINTn, BIPOLAR, BINARY, TERNARY); False for floats, fixed point and
    scaled integers, and for ``None``."""
    return dt is not None and dt.is_integer() and not dt.name.startswith("SCALEDINT")


def datatype_of_values(values: np.ndarray) -> BaseDataType:
    """The narrowest datatype that holds ``values``: an integer type if all are integers (BIPOLAR for {-1, 1}
    only), otherwise FLOAT32."""
    arr = np.asarray(values)
    if arr.size == 0:
        return DataType["FLOAT32"]
    if not np.all(np.isfinite(arr)) or not np.array_equal(arr, np.round(arr)):
        return DataType["FLOAT32"]
    return tightest_datatype(float(arr.min()), float(arr.max()), has_zero=bool(np.any(arr == 0)))


def tightest_datatype(vmin: float, vmax: float, has_zero: bool = True) -> BaseDataType:
    """The integer datatype with the fewest bits that holds the integers of ``[vmin, vmax]``: BIPOLAR for {-1, +1}
    when 0 is not among the values (``has_zero`` False), otherwise :func:`smallest_int_type` (BINARY, UINTn or INTn;
    TERNARY has INT2's two bits, so it is never narrower). FINN sizes hardware from these bit widths."""
    if not has_zero and vmin == -1 and vmax == 1:
        return DataType["BIPOLAR"]
    return smallest_int_type(vmin, vmax)
