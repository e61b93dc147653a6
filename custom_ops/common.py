"""Checks and small helpers shared by the op modules.

Every check takes the op instance so that the :class:`OpError` it raises names the node. Shapes handed to shape
inference may hold symbolic dimensions (strings) or ``None`` for an unknown size; the helpers here treat any
non-integer dimension as unknown and never fail on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:
    from custom_ops.base import CustomOp

Shape = tuple[Any, ...]


def flag_attr(op: "CustomOp", name: str) -> bool:
    """The 0/1 attribute ``name`` as a bool; an error for any other value."""
    value = op.attrs[name]
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise op.fail(f"attribute '{name}' must be 0 or 1, got {value!r}")


def int_attr(op: "CustomOp", name: str, minimum: int) -> int:
    """The integer attribute ``name``, checked to be at least ``minimum``."""
    value = op.attrs[name]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise op.fail(f"attribute '{name}' must be an integer, got {value!r}")
    if value < minimum:
        raise op.fail(f"attribute '{name}' must be at least {minimum}, got {value}")
    return int(value)


def ints_attr(op: "CustomOp", name: str, length: int, minimum: int) -> list[int]:
    """The list-of-ints attribute ``name``, checked to have ``length`` entries, each at least ``minimum``."""
    value = op.attrs[name]
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        raise op.fail(f"attribute '{name}' must be a list of integers, got {value!r}")
    if len(value) != length:
        raise op.fail(f"attribute '{name}' must have {length} entries, got {list(value)}")
    if any(v < minimum for v in value):
        raise op.fail(f"attribute '{name}' entries must be at least {minimum}, got {list(value)}")
    return [int(v) for v in value]


def float_attr(op: "CustomOp", name: str) -> float:
    """The finite float attribute ``name`` as a Python float (so numpy treats it as a weak scalar)."""
    value = op.attrs[name]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise op.fail(f"attribute '{name}' must be a number, got {value!r}")
    if not np.isfinite(value):
        raise op.fail(f"attribute '{name}' must be finite, got {value}")
    return float(value)


def check_scale(op: "CustomOp", value: np.ndarray | None, what: str) -> None:
    """A scale must be finite and strictly positive everywhere (unknown values are not checked)."""
    if value is None:
        return
    arr = np.asarray(value)
    if arr.size == 0:
        raise op.fail(f"{what} is empty")
    if not np.all(np.isfinite(arr)):
        raise op.fail(f"{what} must be finite, got {_preview(arr)}")
    if not np.all(arr > 0):
        raise op.fail(f"{what} must be > 0, got {_preview(arr)}")


def check_finite(op: "CustomOp", value: np.ndarray | None, what: str) -> None:
    """``value`` must be finite everywhere (unknown values are not checked)."""
    if value is not None and not np.all(np.isfinite(np.asarray(value))):
        raise op.fail(f"{what} must be finite, got {_preview(np.asarray(value))}")


#: the widest bitwidth a quantizer may have (its integer bounds must fit a float64 with room to spare)
MAX_BITWIDTH = 64


def scalar_bitwidth(op: "CustomOp", value: np.ndarray | None, what: str) -> int | None:
    """A bitwidth input: one element, an integer in ``[1, MAX_BITWIDTH]``. Returns it as an int (None if
    unknown)."""
    if value is None:
        return None
    arr = np.asarray(value)
    if arr.size != 1:
        raise op.fail(f"{what} must be a single value, got shape {arr.shape}")
    bits = arr.reshape(()).item()
    if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not np.isfinite(bits) or bits != int(bits):
        raise op.fail(f"{what} must be an integer, got {bits!r}")
    if bits < 1:
        raise op.fail(f"{what} must be at least 1, got {int(bits)}")
    if bits > MAX_BITWIDTH:
        raise op.fail(f"{what} must be at most {MAX_BITWIDTH}, got {int(bits)}")
    return int(bits)


def check_broadcast(op: "CustomOp", x_shape: Shape | None, other: Shape | None, what: str) -> None:
    """``other`` must broadcast into ``x_shape`` without enlarging it (unknown dimensions are not checked)."""
    if x_shape is None or other is None:
        return
    if len(other) > len(x_shape):
        raise op.fail(f"{what} of shape {tuple(other)} has more dimensions than the input {tuple(x_shape)}")
    for o, x in zip(reversed(other), reversed(x_shape)):
        if isinstance(o, int) and isinstance(x, int) and o not in (1, x):
            raise op.fail(f"{what} of shape {tuple(other)} does not broadcast to the input {tuple(x_shape)}")


def shape_of(value: np.ndarray | None) -> Shape | None:
    """The shape of a known value, else None."""
    return None if value is None else tuple(np.shape(value))


def float_output(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The result ``y`` of an elementwise quantizer, as float64 if the input ``x`` was float64, else float32
    (qonnx casts to float32; a float64 reference run keeps its precision)."""
    dtype = np.float64 if np.asarray(x).dtype == np.float64 else np.float32
    return np.asarray(y, dtype=dtype)


def known_int(dim: Any) -> int | None:
    """A dimension as an int, or None if symbolic or unknown."""
    return dim if isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) else None


def parse_shape_string(op: "CustomOp", text: str, name: str) -> tuple[int, ...]:
    """A shape written as ``"(1, 8, 8, 3)"`` or ``"[1, 8, 8, 3]"`` (qonnx's Im2Col ``input_shape``)."""
    body = str(text).strip().strip("()[]")
    try:
        dims = tuple(int(part) for part in body.split(",") if part.strip())
    except ValueError:
        raise op.fail(f"attribute '{name}' is not a shape: {text!r}") from None
    if not dims or any(d < 1 for d in dims):
        raise op.fail(f"attribute '{name}' is not a shape: {text!r}")
    return dims


def sliding_windows(x: np.ndarray, window: Sequence[int], axes: Sequence[int], strides: Sequence[int],
                    dilations: Sequence[int] = (1, 1)) -> np.ndarray:
    """A read-only view of ``x`` holding, for every window position, the window's elements in the trailing
    dimensions (one per axis). Positions step by ``strides``; elements inside a window by ``dilations``."""
    span = [d * (k - 1) + 1 for k, d in zip(window, dilations)]
    view = np.lib.stride_tricks.sliding_window_view(x, span, axis=tuple(axes))
    index: list[slice] = [slice(None)] * x.ndim
    for axis, stride in zip(axes, strides):
        index[axis] = slice(None, None, stride)
    index += [slice(None, None, d) for d in dilations]
    return view[tuple(index)]


def execute_by_rows(op: Any, args: Sequence[np.ndarray]) -> np.ndarray:
    """The single output of elementwise custom op ``op`` (a weight quantizer) on ``args``, its kernel run over
    blocks of rows (:func:`by_rows`): bit for bit what the kernel, and the op's lowering, compute on the whole."""
    return by_rows(lambda *a: op.execute(list(a))[0], *args)


def by_rows(fn: Any, *args: np.ndarray, block: int = 1 << 16) -> np.ndarray:
    """``fn(*args)`` for an elementwise ``fn`` of broadcasting arrays, computed over blocks of about ``block``
    elements of rows (axis 0 of the broadcast shape; an argument varying along it is sliced with the block, the
    others are passed whole): the same values, with ``fn``'s temporaries of a block, not of the whole tensor (the
    quantizers make four or five of their input's size)."""
    arrays = [np.asarray(a) for a in args]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    if len(shape) < 1 or shape[0] <= 1 or int(np.prod(shape, dtype=np.int64)) <= block:
        return np.asarray(fn(*args))
    step = max(1, block // max(1, int(np.prod(shape[1:], dtype=np.int64))))
    out: np.ndarray | None = None
    for start in range(0, shape[0], step):
        rows = slice(start, min(start + step, shape[0]))
        y = np.asarray(fn(*(a[rows] if a.ndim == len(shape) and a.shape[0] > 1 else a for a in arrays)))
        if out is None:
            out = np.empty(shape, dtype=y.dtype)
        out[rows] = y
    assert out is not None
    return out


def _preview(arr: np.ndarray, limit: int = 6) -> str:
    flat = arr.ravel()
    text = ", ".join(repr(float(v)) for v in flat[:limit])
    return f"[{text}{', ...' if flat.size > limit else ''}]" if arr.ndim else text


__all__ = ["Shape", "MAX_BITWIDTH", "flag_attr", "int_attr", "ints_attr", "float_attr", "check_scale", "check_finite",
           "scalar_bitwidth", "check_broadcast", "shape_of", "float_output", "known_int", "parse_shape_string",
           "sliding_windows"]
